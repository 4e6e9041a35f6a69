-- The clusters whose actions have a name, at most two (one is the answer; two say the
-- name is several clusters'). NULL is an action the previous release recorded.
SELECT cluster FROM actions
WHERE project = @project AND domain = @domain AND run = @run AND action = @action
ORDER BY cluster NULLS FIRST
LIMIT 2
