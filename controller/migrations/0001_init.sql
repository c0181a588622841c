-- The incident store's first schema. Written once for SQLite and PostgreSQL alike:
-- TEXT and BIGINT columns only, times in nanoseconds since the Unix epoch, flags as 0/1.

-- Incidents: the columns lists filter on, plus the whole incident (warden_model::Incident,
-- JSON, with its most recent timeline entries) as `doc`.
CREATE TABLE incidents (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    job          TEXT,
    state        TEXT NOT NULL,
    acknowledged BIGINT NOT NULL DEFAULT 0,
    severity     TEXT NOT NULL,
    -- Culprit nodes as ",a,b," so one LIKE finds a node.
    nodes        TEXT NOT NULL DEFAULT '',
    detected_at  BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    resolved_at  BIGINT,
    summary      TEXT NOT NULL,
    doc          TEXT NOT NULL
);
CREATE INDEX incidents_by_state ON incidents (state);
CREATE INDEX incidents_by_job ON incidents (job);

-- Every timeline entry of every incident, in order (the document keeps only the latest).
CREATE TABLE incident_timeline (
    incident_id TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    what        TEXT NOT NULL,
    PRIMARY KEY (incident_id, seq)
);

-- Every diagnosis attached to an incident (the document keeps the latest).
CREATE TABLE diagnoses (
    incident_id TEXT NOT NULL,
    at          BIGINT NOT NULL,
    source      TEXT NOT NULL,
    category    TEXT,
    doc         TEXT NOT NULL,
    PRIMARY KEY (incident_id, at)
);

-- Nodes Warden has drained, and who owns each drain.
CREATE TABLE nodes (
    name        TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    owner       TEXT,
    reason      TEXT,
    incident_id TEXT,
    since       BIGINT NOT NULL,
    action_id   TEXT
);

-- The audit log: every action, recorded as intended before it runs and as finished
-- after, so a controller that dies in between finishes it instead of repeating it.
CREATE TABLE actions (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    target      TEXT NOT NULL,
    incident_id TEXT,
    actor       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    dry_run     BIGINT NOT NULL DEFAULT 0,
    status      TEXT NOT NULL,
    result      TEXT,
    intended_at BIGINT NOT NULL,
    finished_at BIGINT
);
CREATE INDEX actions_by_status ON actions (status);

-- Jobs as last seen (phase, scheduler, nodes), as JSON in `doc`.
CREATE TABLE jobs (
    id         TEXT PRIMARY KEY,
    phase      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    doc        TEXT NOT NULL
);

-- Leadership among controllers sharing one database.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
