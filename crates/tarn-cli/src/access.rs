//! Who reaches what: `tarn user ...` (users stored in the pool, with a
//! password read from the terminal or stdin) and `tarn share ...` (a
//! dataset exported over NFS and/or WebDAV).

use std::collections::BTreeMap;
use std::io::IsTerminal;

use anyhow::bail;
use clap::Subcommand;
use tarn_api::access::{
    check_user_name, Access, NbdShare, NfsShare, Share, ShareInfo, UserInfo, WebdavShare,
};
use tarn_api::method;
use tarn_api::params::{
    NoParams, ShareAddParams, ShareDelParams, UserAddParams, UserParams, UserPasswdParams,
};

use crate::render;
use crate::session::{decode, Out, Session};

/// `tarn user ...`.
#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Add a user; asks for the password (or reads it from stdin)
    Add {
        /// The pool that stores the user [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Numeric uid of files the user creates [default: from 10000]
        #[arg(long)]
        uid: Option<u32>,
        /// Numeric gid [default: the uid]
        #[arg(long)]
        gid: Option<u32>,
        /// Read the password from the first line of stdin
        #[arg(long)]
        password_stdin: bool,
        /// Login name
        name: String,
    },
    /// Remove a user
    Del {
        /// The pool [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Login name
        name: String,
    },
    /// Change a user's password
    Passwd {
        /// The pool [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Read the password from the first line of stdin
        #[arg(long)]
        password_stdin: bool,
        /// Login name
        name: String,
    },
    /// List users
    List,
}

/// `tarn share ...`.
#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// Add (or replace) a share: `tarn share add photos tank/photos --nfs
    /// 192.168.1.0/24 --webdav alice=rw --webdav bob=ro`, or of a volume:
    /// `tarn share add vm1 tank/vm1 --nbd 192.168.1.0/24`
    Add {
        /// Share name: NFS export `/NAME`, WebDAV URL `/NAME/`
        name: String,
        /// The dataset: a filesystem (NFS, WebDAV) or a volume (NBD)
        dataset: String,
        /// Export over NFS to this client network (repeatable)
        #[arg(long = "nfs", value_name = "CIDR")]
        nfs: Vec<String>,
        /// The NFS export is read-only
        #[arg(long)]
        nfs_ro: bool,
        /// Let NFS clients act as root (root_squash is on by default)
        #[arg(long)]
        no_root_squash: bool,
        /// Map every NFS user to the anonymous ids
        #[arg(long)]
        all_squash: bool,
        /// Anonymous uid for squashed NFS users
        #[arg(long, default_value_t = 65534)]
        anon_uid: u32,
        /// Anonymous gid for squashed NFS users
        #[arg(long, default_value_t = 65534)]
        anon_gid: u32,
        /// Give a user WebDAV access, `NAME=rw` or `NAME=ro` (repeatable)
        #[arg(long = "webdav", value_name = "USER=rw|ro")]
        webdav: Vec<String>,
        /// Make this user the owner of the dataset's top folder
        #[arg(long, value_name = "USER")]
        owner: Option<String>,
        /// Serve a volume over NBD to this client network (repeatable):
        /// `nbd://HOST/NAME`
        #[arg(long = "nbd", value_name = "CIDR")]
        nbd: Vec<String>,
        /// The NBD export is read-only
        #[arg(long)]
        nbd_ro: bool,
    },
    /// Remove a share
    Del {
        /// The pool [default: the one with that share]
        #[arg(long)]
        pool: Option<String>,
        /// Share name
        name: String,
    },
    /// List shares
    List,
}

/// Reads a password: the first line of stdin with `from_stdin` or when
/// stdin is not a terminal, else from the terminal twice without echo.
fn read_password(from_stdin: bool) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if from_stdin || !stdin.is_terminal() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdin.lock(), &mut line)?;
        let p = line.trim_end_matches(['\n', '\r']).to_string();
        if p.is_empty() {
            bail!("no password on stdin");
        }
        return Ok(p);
    }
    let first = prompt_hidden("Password: ")?;
    let again = prompt_hidden("Again: ")?;
    if first != again {
        bail!("the passwords differ");
    }
    Ok(first)
}

/// Reads one line from the terminal with echo off.
fn prompt_hidden(prompt: &str) -> anyhow::Result<String> {
    eprint!("{prompt}");
    let fd = libc::STDIN_FILENO;
    // SAFETY: termios is plain data; tcgetattr fills it for a valid fd and
    // we only proceed when it succeeds.
    let mut old: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd 0 is open (stdin is a terminal here); `old` is writable.
    let have = unsafe { libc::tcgetattr(fd, &mut old) } == 0;
    if have {
        let mut quiet = old;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: `quiet` is a valid termios derived from the current one.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
    }
    let mut line = String::new();
    let r = std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line);
    if have {
        // SAFETY: restores the settings read above.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &old) };
    }
    eprintln!();
    r?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

pub(crate) fn user_command(
    client: &mut Session,
    out: &Out,
    cmd: UserCommand,
) -> anyhow::Result<()> {
    match cmd {
        UserCommand::Add {
            pool,
            uid,
            gid,
            password_stdin,
            name,
        } => {
            check_user_name(&name).map_err(anyhow::Error::msg)?;
            let password = read_password(password_stdin)?;
            let params = UserAddParams {
                pool,
                name,
                password,
                uid,
                gid,
            };
            client.call_quietly(out, method::USER_ADD, &params)?;
        }
        UserCommand::Del { pool, name } => {
            client.call_quietly(out, method::USER_DEL, &UserParams { pool, name })?;
        }
        UserCommand::Passwd {
            pool,
            password_stdin,
            name,
        } => {
            let password = read_password(password_stdin)?;
            let params = UserPasswdParams {
                pool,
                name,
                password,
            };
            client.call_quietly(out, method::USER_PASSWD, &params)?;
        }
        UserCommand::List => {
            let v = client.call(method::USER_LIST, &NoParams {})?;
            let users: Vec<UserInfo> = decode(method::USER_LIST, v.clone())?;
            out.raw_or(&v, || render::render_users(&users))?;
        }
    }
    Ok(())
}

pub(crate) fn share_command(
    client: &mut Session,
    out: &Out,
    cmd: ShareCommand,
) -> anyhow::Result<()> {
    match cmd {
        ShareCommand::Add {
            name,
            dataset,
            nfs,
            nfs_ro,
            no_root_squash,
            all_squash,
            anon_uid,
            anon_gid,
            webdav,
            owner,
            nbd,
            nbd_ro,
        } => {
            let mut users = BTreeMap::new();
            for w in &webdav {
                let (u, a) = w.split_once('=').unwrap_or((w.as_str(), "rw"));
                let access = match a {
                    "rw" => Access::Rw,
                    "ro" => Access::Ro,
                    other => bail!("--webdav {w}: access must be rw or ro, not {other:?}"),
                };
                users.insert(u.to_string(), access);
            }
            let share = Share {
                name,
                dataset,
                nfs: (!nfs.is_empty()).then_some(NfsShare {
                    clients: nfs,
                    read_only: nfs_ro,
                    root_squash: !no_root_squash,
                    all_squash,
                    anon_uid,
                    anon_gid,
                }),
                webdav: (!webdav.is_empty()).then_some(WebdavShare { users }),
                nbd: (!nbd.is_empty()).then_some(NbdShare {
                    clients: nbd,
                    read_only: nbd_ro,
                }),
            };
            client.call_quietly(out, method::SHARE_ADD, &ShareAddParams { share, owner })?;
        }
        ShareCommand::Del { pool, name } => {
            client.call_quietly(out, method::SHARE_DEL, &ShareDelParams { pool, name })?;
        }
        ShareCommand::List => {
            let v = client.call(method::SHARE_LIST, &NoParams {})?;
            let shares: Vec<ShareInfo> = decode(method::SHARE_LIST, v.clone())?;
            out.raw_or(&v, || render::render_shares(&shares))?;
        }
    }
    Ok(())
}
