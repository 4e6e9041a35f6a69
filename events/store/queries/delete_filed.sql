-- Retention's deletion of up to @limit actions filed in [@from, @to) that finished before
-- @cutoff, in filing order from @from (the last filing the batch before deleted, so that
-- no batch walks the index entries of those before); their events go with the
-- partition. It returns how many went and the last filing among them. Rows are deleted
-- without a lock taken first (one write per row instead of two); a row a Record holds is
-- waited for, and the conditions, repeated, are checked again on the version it leaves,
-- so an action that changed is not deleted.
WITH doomed AS (
    SELECT ctid FROM actions
    WHERE filed_at >= @from AND filed_at < @to AND rank = @terminal_rank AND occurred_at < @cutoff
    ORDER BY filed_at
    LIMIT @limit
),
gone AS (
    DELETE FROM actions
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
      AND filed_at >= @from AND filed_at < @to AND rank = @terminal_rank AND occurred_at < @cutoff
    RETURNING filed_at
)
SELECT count(*), max(filed_at) FROM gone
