-- GetAction: one action's state.
SELECT event, created_at FROM actions
WHERE project = @project AND domain = @domain AND run = @run AND action = @action
