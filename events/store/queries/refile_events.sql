-- Retention's re-filing of the events of the actions refile_actions.sql moved, each to
-- its action's new filing (@filings): Postgres moves each row to the partition of its
-- new filing. Statement triggers on UPDATE do not queue anything in the outbox, so moved
-- events are not published again.
UPDATE action_events e SET filed_at = k.filed_at
FROM unnest(@projects::text[], @domains::text[], @runs::text[], @actions::text[], @clusters::text[], @filings::timestamptz[])
    AS k(project, domain, run, action, cluster, filed_at)
WHERE e.filed_at >= @from AND e.filed_at < @to
  AND e.project = k.project AND e.domain = k.domain AND e.run = k.run AND e.action = k.action
  -- the action's own events, and those the previous release wrote, which name no cluster
  AND (e.cluster IS NOT DISTINCT FROM k.cluster OR e.cluster IS NULL)
