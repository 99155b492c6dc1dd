-- Which transaction last changed a quota counter (txid_current(): 64 bits, never wraps). A
-- flush reads back only the counters changed by transactions not yet complete at its last read
-- back (the snapshot's xmin then), instead of every live counter: an idle counter costs nothing.
-- Existing rows get 0 (read back by the first flush of each gateway anyway); the default, set
-- afterwards, does not rewrite the table.
ALTER TABLE usage_counters ADD COLUMN changed_tx BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_counters ALTER COLUMN changed_tx SET DEFAULT txid_current();
CREATE INDEX usage_counters_changed_tx ON usage_counters (changed_tx);
