-- +goose Up

-- holder is the authenticated identity that took the reservation. An extension or a
-- release must come from the same owner_id and the same identity, so that knowing a
-- holder's owner_id (it is guessable) is not enough to keep or drop its reservation.
-- previous_holder, like previous_owner, records whom the last write took it from.
-- Reservations stored before have no holder: nobody extends them, and they are taken
-- over once they expire, within a few heartbeats.
ALTER TABLE reservations ADD COLUMN holder text, ADD COLUMN previous_holder text;

-- +goose Down
ALTER TABLE reservations DROP COLUMN previous_holder, DROP COLUMN holder;
