-- Version 3: pause/resume, named snapshots, fork (pause.rs, snapshots.rs).

-- A snapshot's files: `<data-dir>/snapshots/<id>/` (the runtime's SnapshotHandle, as JSON,
-- in `handle`). kind: `pause` (a paused sandbox's state), `named` (POST .../snapshots: a
-- template of its own), `fork` (what the children of one fork restore from).
-- A named snapshot the user deleted keeps its row (deleted_at set) while sandboxes still
-- use its files; the files and the row go once nothing uses them (snapshot_users).
CREATE TABLE snapshots (
    id          TEXT PRIMARY KEY,            -- `snap-<16 hex>`
    key_id      TEXT NOT NULL REFERENCES api_keys(id),
    kind        TEXT NOT NULL,               -- pause | named | fork
    name        TEXT,                        -- named only; unique per key while not deleted
    source_id   TEXT NOT NULL,               -- the sandbox it was taken of
    template_id TEXT NOT NULL,               -- the source's templateID
    dir         TEXT NOT NULL,
    handle      TEXT,                        -- NULL until the runtime wrote the snapshot
    created_at  INTEGER NOT NULL,
    deleted_at  INTEGER
);

CREATE UNIQUE INDEX snapshots_live_name ON snapshots(key_id, name)
    WHERE name IS NOT NULL AND deleted_at IS NULL;

-- Which sandboxes need which snapshot's files: one restored from it (its root layer lies
-- on the snapshot's), one paused into it, one that was checkpointed into it and restored
-- in place. A row only counts while its sandbox is in a live state (state.rs LIVE).
CREATE TABLE snapshot_users (
    snapshot_id TEXT NOT NULL REFERENCES snapshots(id),
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes(id),
    PRIMARY KEY (snapshot_id, sandbox_id)
);

CREATE INDEX snapshot_users_by_sandbox ON snapshot_users(sandbox_id);

-- What a sandbox is beyond its row in `sandboxes`: what it does at its timeout, the
-- snapshot it is paused in, and the sandbox it was forked from.
CREATE TABLE sandbox_lifecycle (
    sandbox_id     TEXT PRIMARY KEY REFERENCES sandboxes(id),
    auto_pause     INTEGER NOT NULL DEFAULT 0,
    paused_in      TEXT REFERENCES snapshots(id),
    parent_id      TEXT REFERENCES sandboxes(id)
);

CREATE INDEX sandbox_lifecycle_by_parent ON sandbox_lifecycle(parent_id);
