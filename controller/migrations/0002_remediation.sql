-- Remediation state that must outlive a restart: the circuit breaker (isolations in
-- its window, whether it tripped), per-node cooldowns, the rate limiter, and which
-- incidents the policy already acted on. One JSON document per name.
CREATE TABLE remediation_state (
    name       TEXT PRIMARY KEY,
    doc        TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);
