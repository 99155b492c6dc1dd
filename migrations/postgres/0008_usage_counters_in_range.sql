-- Counters are whole numbers in 0..=9223372036854775807 (the gateway's additions saturate).
-- Before they did, an absurd usage report could wrap a counter round to a negative; such a
-- counter is set to 0.
UPDATE usage_counters SET used = 0 WHERE used < 0;
