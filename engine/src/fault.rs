//! Fault points for tests (cargo feature `fault-injection`, which release
//! builds leave out): with `KUBEXM_FAULT_KILL_AFTER=TEXT` in its
//! environment, the process kills itself with SIGKILL right after a step
//! whose id (`module/task/step@host`) contains TEXT was applied and
//! recorded: a crash at a point a test cannot hit by polling (a learner
//! added and not yet promoted is promoted within milliseconds).

/// Kills this process when one of `applied` (step ids) is the fault point.
pub fn after_applied<'a>(mut applied: impl Iterator<Item = &'a str>) {
    let Some(point) = std::env::var("KUBEXM_FAULT_KILL_AFTER").ok().filter(|p| !p.is_empty()) else {
        return;
    };
    if let Some(id) = applied.find(|id| id.contains(&point)) {
        eprintln!("fault injection: SIGKILL after {id} (KUBEXM_FAULT_KILL_AFTER={point})");
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        std::process::abort();
    }
}
