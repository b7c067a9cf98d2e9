//! Headless Chromium for the browser suites (`tests/dashboard.rs`,
//! `tests/badges.rs`): their tests are ignored by default, and
//! `scripts/test.sh` runs them with `--ignored` where it has a `chromium`
//! (installing Debian's when it is root and has apt-get), or says why not.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `chromium`, unless `CHROMIUM` names another binary.
pub fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// The flags of every headless Chromium of these tests.
pub const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
];

/// Runs headless Chromium on `url` with `extra` arguments and answers what
/// it printed; panics, saying why, when it cannot run or takes over 90 s.
pub fn run_chromium(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let out_dir = tempfile::tempdir().expect("output dir");
    let out_path = out_dir.path().join("stdout");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let mut child = Command::new(chromium())
        .args(CHROMIUM_FLAGS)
        .arg("--virtual-time-budget=8000")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e} (install chromium)", chromium()));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match child.try_wait().expect("wait for chromium") {
            Some(status) => {
                assert!(status.success(), "chromium exited with {status}");
                break;
            }
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium took over 90 s on {url}");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    std::fs::read_to_string(&out_path).expect("chromium output")
}
