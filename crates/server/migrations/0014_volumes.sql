-- Version 14: E2B's volumes (volumes/). A volume belongs to one API key; `name` is unique
-- per key. Its content is a JuiceFS filesystem whose data lives in the operator's bucket
-- under the prefix `id`, its metadata in `<data-dir>/volumes/<id>/meta.db`. `token` is the
-- bearer token of E2B's volume content API (shown to the owning key, as E2B does).
CREATE TABLE volumes (
    id          TEXT PRIMARY KEY,           -- `vol-<16 hex>` (also the JuiceFS name)
    key_id      TEXT NOT NULL REFERENCES api_keys(id),
    name        TEXT NOT NULL,
    token       TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    UNIQUE (key_id, name)
);

-- The volumes a sandbox mounts (E2B's `volumeMounts`), recorded before it boots. A volume
-- with a row here whose sandbox is not yet killed or failed cannot be deleted.
CREATE TABLE sandbox_volumes (
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes(id),
    volume_id   TEXT NOT NULL REFERENCES volumes(id) ON DELETE CASCADE,
    path        TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, path)
);
CREATE INDEX sandbox_volumes_by_volume ON sandbox_volumes (volume_id);
