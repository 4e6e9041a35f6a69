-- Retention's deletion of up to @limit abandoned actions filed in [@from, @to): not
-- finished, and their newest state older than @abandon_cutoff (the executor that ran
-- them is gone, or lost them). Their events go with the partition. It returns their
-- keys, for the log. As in delete_filed.sql, a row a Record holds is waited for and the
-- conditions are checked again on the version it leaves, so an action that moved on
-- is kept.
WITH doomed AS (
    SELECT ctid FROM actions
    WHERE filed_at >= @from AND filed_at < @to AND rank < @terminal_rank AND occurred_at < @abandon_cutoff
    ORDER BY filed_at
    LIMIT @limit
)
DELETE FROM actions
WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
  AND filed_at >= @from AND filed_at < @to AND rank < @terminal_rank AND occurred_at < @abandon_cutoff
RETURNING project, domain, run, action
