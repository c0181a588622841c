//! The Slurm actuator: drain, resume and requeue through `scontrol`.
