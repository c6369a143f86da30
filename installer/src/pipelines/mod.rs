//! Pipelines: each a plain list of phases (modules from `phases/`) with
//! their ordering rules. `install` deploys a cluster, `reset` undoes it; the
//! day-2 operations add theirs here.

pub mod install;
pub mod reset;
