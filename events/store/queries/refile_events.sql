-- Retention's re-filing of the events of the actions refile_actions.sql moved: Postgres
-- moves each row to the partition of its new filing. Statement triggers on UPDATE do not
-- queue anything in the outbox, so moved events are not published again.
UPDATE action_events e SET filed_at = @now
FROM unnest(@projects::text[], @domains::text[], @runs::text[], @actions::text[]) AS k(project, domain, run, action)
WHERE e.filed_at >= @from AND e.filed_at < @to
  AND e.project = k.project AND e.domain = k.domain AND e.run = k.run AND e.action = k.action
