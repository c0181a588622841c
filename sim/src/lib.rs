//! Warden simulator.
