-- The node-health ledger (engine/src/ledger.rs): one JSON document per node (its state,
-- the evidence within the window, its history), with the state and since when kept as
-- columns to filter on.
CREATE TABLE node_health (
    node  TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    since BIGINT NOT NULL,
    doc   TEXT NOT NULL
);
