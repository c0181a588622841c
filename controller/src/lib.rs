//! Warden controller.
