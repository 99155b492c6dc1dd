-- A trip's history row is written once per key and trip, whichever write (or gateway) comes
-- first and in whatever order the trips' writes land; keep the first of any doubles.
DELETE FROM breaker_trips
WHERE id NOT IN (SELECT MIN(id) FROM breaker_trips GROUP BY key_id, trip);
CREATE UNIQUE INDEX breaker_trips_key_trip ON breaker_trips (key_id, trip);
