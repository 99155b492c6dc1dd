-- Postgres only (its 0021 marks which transaction last changed a quota counter, so a flush reads
-- back only the changed ones). One SQLite file serves one host: a flush reads back each live
-- counter by its key, as before. Kept so both backends count the same migrations.
SELECT 1;
