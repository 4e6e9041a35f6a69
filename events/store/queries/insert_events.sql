-- Record's insert of a batch holding events already stored (a redelivery): what is
-- stored already is absorbed by the primary key. New events are copied in instead,
-- which is faster. The parameters are numbered as fold.sql's are.
INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at, cluster)
SELECT * FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[],
    $5::integer[], $6::smallint[], $7::integer[], $8::timestamptz[], $9::bytea[], $10::timestamptz[], $11::text[])
ON CONFLICT DO NOTHING
