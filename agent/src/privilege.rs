//! Privilege separation inside the agent: open the two things that may need a
//! capability (the kernel log, and the capture socket in a directory the agent does not
//! own), then give up every capability for good, before the first thread starts.
//!
//! The agent needs at most two capabilities, and only for those two opens:
//!
//! - `CAP_SYSLOG` to open `/dev/kmsg` when `kernel.dmesg_restrict=1`. The open file
//!   stays readable without it.
//! - `CAP_DAC_OVERRIDE` to bind the capture socket in `/run/warden` when that directory
//!   is root's (the kubelet creates `hostPath` directories root-owned, mode 0755). The
//!   bound socket keeps accepting without it. The same capability connects to the
//!   kubelet's pod-resources socket (root's, mode 0755); the connection is kept.
//!
//! [`preopen`] does these; [`drop_all`] then empties the effective, permitted,
//! inheritable and ambient sets and sets `no_new_privs`, so that nothing the process
//! runs later can gain a capability again, a file capability or set-user-ID bit
//! included. Capabilities belong to threads: [`drop_all`] must run while the process
//! still has one thread (threads started later copy the empty sets). `warden-agent`
//! calls both before it builds its async runtime. Under systemd the capabilities
//! arrive as ambient ones; in a container image as file capabilities on the binary
//! (docs/DEPLOY.md). Run without any, the opens fail with a clear error and those two
//! collectors report themselves down.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};

use rustix::thread::{CapabilitySet, CapabilitySets};

use crate::config::AgentConfig;
use crate::kernel_log::KernelSource;

/// What [`preopen`] opened, or why it could not, for the runtime to use instead of
/// opening the same paths itself.
#[derive(Debug, Default)]
pub struct Preopened {
    /// The kernel log (`None`: the collector is disabled, or nothing was preopened).
    pub kmsg: Option<io::Result<KernelSource>>,
    /// The capture socket (`None`: capture is disabled, or nothing was preopened).
    pub capture: Option<io::Result<UnixListener>>,
    /// A connection to the kubelet's pod-resources socket (`None`: disabled, no such
    /// socket on this node, or nothing was preopened).
    pub pod_resources: Option<io::Result<UnixStream>>,
}

/// Open the kernel log, bind the capture socket and connect to the kubelet's
/// pod-resources socket of `cfg`, each only where enabled (the last only where it exists).
/// Errors are kept for the runtime, which reports the collector down with them.
pub fn preopen(cfg: &AgentConfig, now_ns: i64) -> Preopened {
    Preopened {
        kmsg: cfg
            .kmsg
            .enabled
            .then(|| KernelSource::open(&cfg.kmsg.path, now_ns)),
        capture: cfg
            .capture
            .enabled
            .then(|| crate::capture::bind(&cfg.capture.socket)),
        pod_resources: (cfg.wants_pod_labels() && cfg.pod_resources.socket.exists())
            .then(|| UnixStream::connect(&cfg.pod_resources.socket)),
    }
}

/// The calling thread's capabilities and `no_new_privs` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privileges {
    /// Effective capabilities.
    pub effective: CapabilitySet,
    /// Permitted capabilities (what the thread could make effective).
    pub permitted: CapabilitySet,
    /// Whether `no_new_privs` is set.
    pub no_new_privs: bool,
}

impl Privileges {
    /// Read the calling thread's.
    pub fn current() -> Result<Privileges, PrivilegeError> {
        let sets =
            rustix::thread::capabilities(None).map_err(|e| PrivilegeError::Read(e.into()))?;
        let no_new_privs =
            rustix::thread::no_new_privs().map_err(|e| PrivilegeError::Read(e.into()))?;
        Ok(Privileges {
            effective: sets.effective,
            permitted: sets.permitted,
            no_new_privs,
        })
    }

    /// Holds no capability, and cannot gain one.
    pub fn none(&self) -> bool {
        self.effective.is_empty() && self.permitted.is_empty() && self.no_new_privs
    }

    /// Names of the permitted capabilities, `cap_syslog` style (for the log).
    pub fn permitted_names(&self) -> Vec<String> {
        self.permitted
            .iter_names()
            .map(|(name, _)| format!("cap_{}", name.to_ascii_lowercase()))
            .collect()
    }
}

/// Why privileges could not be read or given up.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// `capget` or `prctl(PR_GET_NO_NEW_PRIVS)` failed.
    #[error("cannot read this process's capabilities: {0}")]
    Read(#[source] io::Error),
    /// Emptying a capability set failed.
    #[error("cannot drop capabilities: {0}")]
    Drop(#[source] io::Error),
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(#[source] io::Error),
}

/// Give up every capability of the calling thread and set `no_new_privs`. Returns what
/// it held before. Call it while the process has one thread.
pub fn drop_all() -> Result<Privileges, PrivilegeError> {
    let before = Privileges::current()?;
    // The ambient set only exists since Linux 4.3; EINVAL before that means empty.
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(PrivilegeError::Drop(e.into())),
    }
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| PrivilegeError::Drop(e.into()))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| PrivilegeError::NoNewPrivs(e.into()))?;
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_dropped_everything_holds_nothing_and_its_children_neither() {
        // On a thread of its own: the test harness's other threads keep theirs.
        let after = std::thread::spawn(|| {
            drop_all().expect("drop");
            let me = Privileges::current().expect("read");
            let child = std::thread::spawn(|| Privileges::current().expect("read"))
                .join()
                .expect("child");
            // Raising one back is refused now.
            let raise = rustix::thread::set_capabilities(
                None,
                CapabilitySets {
                    effective: CapabilitySet::SYSLOG,
                    permitted: CapabilitySet::SYSLOG,
                    inheritable: CapabilitySet::empty(),
                },
            );
            (me, child, raise.is_err())
        })
        .join()
        .expect("thread");
        let (me, child, refused) = after;
        assert!(me.none(), "{me:?}");
        assert!(child.none(), "{child:?}");
        assert!(refused, "a dropped capability came back");
        assert!(me.permitted_names().is_empty());
    }

    #[test]
    fn names_read_like_capabilities_h() {
        let p = Privileges {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::SYSLOG | CapabilitySet::DAC_OVERRIDE,
            no_new_privs: false,
        };
        let mut names = p.permitted_names();
        names.sort();
        assert_eq!(names, ["cap_dac_override", "cap_syslog"]);
        assert!(!p.none());
    }
}
