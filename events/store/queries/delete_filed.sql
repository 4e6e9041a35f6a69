-- Retention's deletion of up to @limit actions filed in [@from, @to) that finished before
-- @cutoff; their events go with the partition.
DELETE FROM actions a
USING (
    SELECT project, domain, run, action FROM actions
    WHERE filed_at >= @from AND filed_at < @to AND rank = @terminal_rank AND occurred_at < @cutoff
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
) d
WHERE a.project = d.project AND a.domain = d.domain AND a.run = d.run AND a.action = d.action
