//! A MinIO server on loopback, for the tests of replication to an object
//! store.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::process::{succeeded, Daemon};
use tarn_testkit::net::free_port;

/// MinIO's root user.
pub const USER: &str = "tarn-test";
/// Its password.
pub const SECRET: &str = "tarn-test-secret-key";
/// The bucket the tests use (made at start).
pub const BUCKET: &str = "offsite";

/// A MinIO server on a free loopback port, with its data in a folder.
pub struct Minio {
    child: Child,
    pub endpoint: String,
}

impl Drop for Minio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Minio {
    pub fn start(minio: &Path, dir: &Path) -> Minio {
        let (port, console) = (free_port(), free_port());
        let child = Command::new(minio)
            .args(["server", "--quiet", "--address"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--console-address")
            .arg(format!("127.0.0.1:{console}"))
            .arg(dir)
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", SECRET)
            .env("MINIO_BROWSER", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start minio");
        let m = Minio {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let t0 = Instant::now();
        loop {
            let mut b = m.bucket();
            match b.create() {
                Ok(()) => break,
                Err(e) => assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "minio did not start: {e}"
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }

    pub fn config(&self) -> tarn_s3::Config {
        tarn_s3::Config {
            endpoint: tarn_s3::http::Endpoint::parse(&self.endpoint).unwrap(),
            path_style: true,
            signer: tarn_s3::sigv4::Signer::new(USER, SECRET, "us-east-1"),
        }
    }

    pub fn bucket(&self) -> tarn_s3::Bucket {
        tarn_s3::Bucket::new(self.config(), BUCKET).unwrap()
    }

    /// The CLI against `d`, with this store's settings in its environment.
    pub fn command(&self, d: &Daemon, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tarn"));
        c.arg("--socket")
            .arg(&d.socket)
            .args(args)
            .env_remove("TARN_SOCKET")
            .env("TARN_S3_ENDPOINT", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", USER)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_REGION", "us-east-1");
        c
    }

    pub fn run(&self, d: &Daemon, args: &[&str]) -> Output {
        self.command(d, args).output().expect("run tarn")
    }

    pub fn ok(&self, d: &Daemon, args: &[&str]) -> String {
        succeeded(self.run(d, args), &format!("tarn {args:?}"))
    }
}
