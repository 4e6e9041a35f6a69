-- Record's filings of the actions its fold did not change, by their place in the batch:
-- the fold locked them, so a new snapshot reads their filing as it stays until commit.
SELECT k.ord, a.filed_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) AS k(project, domain, run, action, ord)
JOIN actions a USING (project, domain, run, action)
