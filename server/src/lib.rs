//! kubexm-server: clusters as jobs. A request (`kubexm create cluster`) is
//! validated and stored as a job in the job database ([`jobdb`]); a worker
//! ([`worker`]) claims it and runs the same operation the CLI runs, on the
//! same engine, writing the current step and every log line into the
//! database as it goes; clients read and follow them ([`ops`]). Binary:
//! `kubexm`.

pub mod api;
pub mod bundles;
pub mod client;
pub mod credentials;
pub mod job_request;
pub mod jobdb;
pub mod ops;
pub mod testing;
/// Text from a request or a host made safe to store and show (kept in kubexm-bom, which the controller shares).
pub use kubexm_bom::text;
pub mod worker;
