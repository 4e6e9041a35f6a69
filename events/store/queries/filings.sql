-- Record's filings of the actions its fold did not change, by their place in the batch:
-- the fold locked them, so a new snapshot reads their filing as it stays until commit.
-- current says the stored state is the batch's winning event ($6-$8 its attempt, phase
-- and version): a redelivery of the event that set it, which Record announces again.
SELECT k.ord, a.filed_at,
       (a.attempt, a.phase, a.version) = (k.attempt, k.phase, k.version) AS current
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::integer[], $7::smallint[], $8::integer[], $9::text[])
    AS k(project, domain, run, action, ord, attempt, phase, version, cluster)
JOIN actions a USING (project, domain, run, action, cluster)
