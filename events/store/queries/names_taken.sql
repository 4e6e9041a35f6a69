-- Record's check, after adopt.sql, of the batch's actions ($1-$4 their names, $5 their
-- clusters) whose name another cluster's action holds under the previous release's key
-- of the name alone: their places in the batch (from 1) and the holder's cluster.
SELECT k.ord, a.cluster
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY
    AS k(project, domain, run, action, cluster, ord)
JOIN actions a ON (a.project, a.domain, a.run, a.action) = (k.project, k.domain, k.run, k.action)
WHERE a.cluster IS DISTINCT FROM k.cluster
ORDER BY k.ord
