-- Counters are whole numbers in 0..=9223372036854775807 (the gateway's additions saturate).
-- Before they did, an absurd usage report could leave a counter past that range, which SQLite
-- keeps as a REAL that no longer reads back as an integer, or wrapped round to a negative.
-- Such a counter is set to the top of the range (its quota used up) or to 0.
UPDATE usage_counters
   SET used = CASE WHEN used > 9223372036854775807 THEN 9223372036854775807
                   WHEN used < 0 THEN 0
                   ELSE CAST(used AS INTEGER) END
 WHERE typeof(used) <> 'integer' OR used < 0;
