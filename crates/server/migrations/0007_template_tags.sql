-- Version 7: E2B template tags (template_tags.rs). A tag names one build of a template;
-- creates from `name:tag` work while that build is the template's current one (only the
-- latest build's image is kept on disk).
CREATE TABLE template_tags (
    template_id TEXT NOT NULL,
    tag         TEXT NOT NULL,
    build_id    TEXT NOT NULL,
    assigned_at INTEGER NOT NULL,
    PRIMARY KEY (template_id, tag)
);

-- The tags a build asked for (POST /v3/templates: `default`, the name's tag and `tags`),
-- until it ends.
CREATE TABLE template_build_tags (
    build_id TEXT NOT NULL,
    tag      TEXT NOT NULL,
    PRIMARY KEY (build_id, tag)
);

-- A build that becomes ready takes its tags (from whatever build had them), in the same
-- statement that records it ready (template_builds.rs record_status), so that no reader
-- ever sees a ready build without its tags; a failed build's requests are dropped. These
-- triggers live on template_builds: a migration that recreates that table must recreate
-- them (tests/template_tags.rs would catch it: the tags a build asked for are asserted).
CREATE TRIGGER template_build_ready_takes_its_tags
AFTER UPDATE OF status ON template_builds
WHEN NEW.status = 'ready' AND OLD.status <> 'ready'
BEGIN
    INSERT OR REPLACE INTO template_tags (template_id, tag, build_id, assigned_at)
        SELECT NEW.template_id, tag, NEW.build_id, COALESCE(NEW.finished_at, 0)
        FROM template_build_tags WHERE build_id = NEW.build_id;
    DELETE FROM template_build_tags WHERE build_id = NEW.build_id;
END;

CREATE TRIGGER template_build_failed_drops_its_tags
AFTER UPDATE OF status ON template_builds
WHEN NEW.status = 'error'
BEGIN
    DELETE FROM template_build_tags WHERE build_id = NEW.build_id;
END;
