-- Version 16: memory snapshots of installed templates that have a start command
-- (templates/installed_snapshot.rs). The daemon takes them under a key of its own that no
-- request can present (its hash is no sha256 hex) and that key listings leave out, so that
-- no tenant can reach the sandbox a snapshot every tenant restores is taken from.
INSERT INTO api_keys (id, name, key_hash, key_prefix, is_admin, created_at)
VALUES ('key_system', 'sandcell-system', 'none: the daemon''s own key', '', 0, 0);

CREATE TABLE installed_template_snapshots (
    template_id  TEXT PRIMARY KEY,
    -- (No foreign key: a retired snapshot's row goes once its files do, store/snapshots.rs.)
    -- sha256 of the image's `.installed` identity, its `e2b.json` and the runtime: a
    -- reinstalled image or another runtime makes the snapshot stale.
    fingerprint  TEXT NOT NULL,
    snapshot_id  TEXT NOT NULL,
    created_at   INTEGER NOT NULL
);
