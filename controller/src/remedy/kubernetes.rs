//! The Kubernetes actuator: cordon, taint, annotate, evict and restart through the API server.
