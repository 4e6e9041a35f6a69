-- +goose Up

-- holder_run and holder_action name the action a reservation's holder computes the key
-- for (in the key's project and domain), so that those it refuses can say whom they wait
-- on. NULL when the holder named none, as v0.1.0 never does (an expand: it ignores them).
ALTER TABLE reservations ADD COLUMN IF NOT EXISTS holder_run text, ADD COLUMN IF NOT EXISTS holder_action text;
