-- GetAction: one action's state, with its cluster. @cluster NULL takes the name's action
-- of any cluster; two rows back say the name is several clusters'. An action the
-- previous release recorded names no cluster (NULL) and is found under any.
SELECT event, created_at, cluster FROM actions
WHERE project = @project AND domain = @domain AND run = @run AND action = @action
  AND (@cluster::text IS NULL OR cluster = @cluster::text OR cluster IS NULL)
ORDER BY cluster NULLS FIRST
LIMIT 2
