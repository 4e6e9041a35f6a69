-- ActionsByKey: the state of each named action that exists.
SELECT a.event, a.created_at
FROM unnest(@projects::text[], @domains::text[], @runs::text[], @actions::text[]) AS k(project, domain, run, action)
JOIN actions a USING (project, domain, run, action)
