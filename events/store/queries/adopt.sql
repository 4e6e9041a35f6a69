-- Record's adoption (store.go, adopt), while the previous release's key of the name
-- alone remains (00014): the batch's actions ($1-$4 their names, $5 their clusters) that
-- the previous release wrote, which name no cluster, become their event's cluster's,
-- with their events (all in the action's filing). Actions first, then events, as every
-- writer locks them. It returns how many actions it adopted.
WITH k AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        AS k(project, domain, run, action, cluster)
),
adopted AS (
    UPDATE actions a SET cluster = k.cluster
    FROM k
    WHERE (a.project, a.domain, a.run, a.action) = (k.project, k.domain, k.run, k.action)
      AND a.cluster IS NULL
    RETURNING a.project, a.domain, a.run, a.action, a.cluster, a.filed_at
),
events AS (
    UPDATE action_events e SET cluster = d.cluster
    FROM adopted d
    WHERE (e.project, e.domain, e.run, e.action) = (d.project, d.domain, d.run, d.action)
      AND e.filed_at = d.filed_at AND e.cluster IS NULL
)
SELECT count(*) FROM adopted
