-- Version 8: template ownership and visibility (templates/access.rs). A template belongs to
-- the key whose build request first claimed its name (E2B: the team that built it); only
-- that key (or an admin key) rebuilds, tags, deletes or publishes it, and it is private
-- (seen by its owner and admin keys only) unless `public`. A name without a row is a
-- system template (an installed image, or one built on the host with `sandcell build`):
-- public, changed by admin keys only. A row without an owner is a system template an
-- admin made private.
CREATE TABLE templates (
    name         TEXT PRIMARY KEY,
    owner_key_id TEXT,
    public       INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL
);

-- Templates built through the API before this version: the key of their first successful
-- build owns them (private, as E2B's are; the owner or an admin makes them public with
-- PATCH /templates/{id}). SQLite takes the bare column from the row MIN() picked.
INSERT INTO templates (name, owner_key_id, public, created_at)
    SELECT template_id, key_id, 0, MIN(created_at) FROM template_builds
    WHERE status = 'ready' GROUP BY template_id;
