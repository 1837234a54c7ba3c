//! Running `ip` (iproute2) and friends, with failures turned into errors that quote the
//! command and its stderr.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::Error;

fn render(program: &str, args: &[&str]) -> String {
    let mut s = program.to_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Runs `program args…`, returns its stdout; a non-zero exit is an [`Error::Command`].
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command {
            command: render(program, args),
            detail: format!("cannot start: {e}"),
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: render(program, args),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip args…`.
pub(crate) fn ip(args: &[&str]) -> Result<String, Error> {
    run("ip", args)
}

/// Runs several `ip` commands in namespace `ns` with one process (`ip -n NS -batch -`).
/// Stops at the first failing line, whose text is in the error.
pub(crate) fn ip_batch(ns: &str, lines: &[String]) -> Result<(), Error> {
    if lines.is_empty() {
        return Ok(());
    }
    let command = format!("ip -n {ns} -batch - <<{} lines>>", lines.len());
    let mut child = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Command {
            command: command.clone(),
            detail: format!("cannot start: {e}"),
        })?;
    let text = lines.join("\n") + "\n";
    if let Some(mut stdin) = child.stdin.take() {
        // A write error shows up as a failed exit below.
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| Error::Command {
        command: command.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("ip -n {ns} -batch - with:\n    {}", lines.join("\n    ")),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// Sets sysctls inside namespace `ns` (`ip netns exec NS sysctl -qw k=v …`).
pub(crate) fn sysctl_in(ns: &str, settings: &[&str]) -> Result<(), Error> {
    let mut args = vec!["netns", "exec", ns, "sysctl", "-qw"];
    args.extend_from_slice(settings);
    ip(&args).map(|_| ())
}

/// Whether `program` can be started at all.
pub(crate) fn available(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}
