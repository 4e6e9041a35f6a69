-- Record's fold, before the batch's events go in within the same transaction: each
-- action's winning event ($1-$11 and its cluster $13, one per action, sorted by key)
-- replaces the action's state only when greater, in the order of (attempt, rank,
-- version, occurred_at, phase).
-- A new action is filed at $12 (store/partitions.go); an existing one keeps its filing.
-- An action is its name and its cluster (actions_cluster_key, 00014). While the
-- previous release's key of the name alone remains, a name another cluster holds, or a
-- row of the previous release, which names no cluster, fails the insert on that key:
-- Record then adopts or refuses (store.go, adopt).
-- Every writer locks actions before events, as this does, or two batches could
-- deadlock; ON CONFLICT DO UPDATE locks the rows it does not update too, so no
-- re-filing by retention can move one of the batch's actions before its events are in.
--
-- It returns each changed action's place in the batch (from 1) and its filing. The
-- events of unchanged actions (redeliveries, late events) are filed by filings.sql.
--
-- The parameters of Record's statements are numbered, not named like the others': pgx
-- rewrites names by lexing the whole statement on every call, 77 µs for this one, as
-- much CPU as a batch's first few events cost.
WITH batch AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[],
        $5::integer[], $6::smallint[], $7::integer[], $8::smallint[],
        $9::timestamptz[], $10::timestamptz[], $11::bytea[], $13::text[])
        WITH ORDINALITY AS b(project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event, cluster, ord)
),
upserted AS (
    INSERT INTO actions AS a (project, domain, run, action, cluster, attempt, phase, version, rank, occurred_at, created_at, event, filed_at)
    SELECT project, domain, run, action, cluster, attempt, phase, version, rank, occurred_at, created_at, event, $12::timestamptz
    FROM batch
    ON CONFLICT (project, domain, run, action, cluster) DO UPDATE
    SET attempt = EXCLUDED.attempt, phase = EXCLUDED.phase, version = EXCLUDED.version,
        rank = EXCLUDED.rank, occurred_at = EXCLUDED.occurred_at, event = EXCLUDED.event,
        created_at = LEAST(a.created_at, EXCLUDED.created_at)
    WHERE (EXCLUDED.attempt, EXCLUDED.rank, EXCLUDED.version, EXCLUDED.occurred_at, EXCLUDED.phase)
        > (a.attempt, a.rank, a.version, a.occurred_at, a.phase)
    RETURNING project, domain, run, action, cluster, filed_at
)
SELECT b.ord, u.filed_at FROM upserted u JOIN batch b USING (project, domain, run, action, cluster)
