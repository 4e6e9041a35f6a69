-- The partitions' maintenance gives actions the previous release recorded the cluster
-- their event names ($1 their ids, $2 the clusters), and their events too (all in the
-- action's filing). Actions first, then events, as every writer locks them; a row a
-- Record adopted meanwhile is left as it is. It returns how many actions it changed.
WITH k AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS k(id, cluster)
),
done AS (
    UPDATE actions a SET cluster = k.cluster
    FROM k
    WHERE a.id = k.id AND a.cluster IS NULL
    RETURNING a.project, a.domain, a.run, a.action, a.cluster, a.filed_at
),
events AS (
    UPDATE action_events e SET cluster = d.cluster
    FROM done d
    WHERE (e.project, e.domain, e.run, e.action) = (d.project, d.domain, d.run, d.action)
      AND e.filed_at = d.filed_at AND e.cluster IS NULL
)
SELECT count(*) FROM done
