//! Who reaches what: `tarn user ...` (users stored in the pool, with a
//! password read from the terminal or stdin, and a CHAP secret for iSCSI)
//! and `tarn share ...` (a filesystem exported over NFS and/or WebDAV, a
//! volume over NBD and/or iSCSI).

use std::collections::BTreeMap;
use std::io::IsTerminal;

use anyhow::bail;
use clap::Subcommand;
use tarn_api::access::{
    check_user_name, Access, IscsiShare, NbdShare, NfsShare, Share, ShareInfo, SmbEncrypt,
    SmbShare, UserInfo, WebdavShare,
};
use tarn_api::method;
use tarn_api::params::{
    NoParams, ShareAddParams, ShareDelParams, UserAddParams, UserChapParams, UserParams,
    UserPasswdParams,
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
        /// The user may log in over SMB: also keep the NT hash Samba
        /// checks passwords with (weaker than the main hash; see docs/smb.md)
        #[arg(long)]
        smb: bool,
        /// An administrator of the web page and the HTTPS API
        #[arg(long)]
        admin: bool,
        /// Login name
        name: String,
    },
    /// Make a user an administrator of the web page and the HTTPS API
    /// (`on`), or not (`off`)
    Admin {
        /// The pool [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Login name
        name: String,
        /// on or off
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Bearer tokens for scripts that call the HTTPS API as a user
    #[command(subcommand)]
    Token(ApiTokenCommand),
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
        /// From now on the user may log in over SMB (an NT hash is kept)
        #[arg(long)]
        smb: bool,
        /// From now on the user may not log in over SMB (the NT hash is
        /// dropped) [default: as before]
        #[arg(long, conflicts_with = "smb")]
        no_smb: bool,
        /// Login name
        name: String,
    },
    /// Set a user's CHAP secret for iSCSI logins (12 to 255 bytes, not
    /// the password: it is stored as given); asks for it, or reads it
    /// from stdin
    Chap {
        /// The pool [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Read the secret from the first line of stdin
        #[arg(long)]
        secret_stdin: bool,
        /// Remove the secret instead
        #[arg(long, conflicts_with = "secret_stdin")]
        remove: bool,
        /// Login name
        name: String,
    },
    /// List users
    List,
}

/// `tarn user token ...`.
#[derive(Subcommand, Debug)]
pub enum ApiTokenCommand {
    /// Make a token that acts as USER (with USER's role); it is printed
    /// once, only its hash is kept
    Add {
        /// The user's pool [default: the only pool with that user]
        #[arg(long)]
        pool: Option<String>,
        /// A name for what uses it, e.g. backup-script
        label: String,
        /// The user it acts as
        user: String,
    },
    /// List the tokens (labels and users, never the tokens)
    List,
    /// Remove a token: it stops working at once
    #[command(alias = "rm")]
    Del {
        /// The token's label
        label: String,
    },
}

/// `tarn share ...`.
// Parsed once per run: the size of the `Add` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// Add (or replace) a share: `tarn share add photos tank/photos --nfs
    /// 192.168.1.0/24 --webdav alice=rw --webdav bob=ro`, or of a volume:
    /// `tarn share add vm1 tank/vm1 --nbd 192.168.1.0/24 --iscsi
    /// auto,chap=alice`
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
        /// Serve a volume over iSCSI: `IQN|auto[,chap=USER][,mutual=USER]
        /// [,client=CIDR]...[,initiator=NAME]...`; auto names the target
        /// iqn.2026-11.org.tarn:POOL.SHARE. Without client= any network
        /// may connect, which needs chap=
        #[arg(long = "iscsi", value_name = "SPEC")]
        iscsi: Option<String>,
        /// The iSCSI target is read-only
        #[arg(long, requires = "iscsi")]
        iscsi_ro: bool,
        /// Serve a filesystem over SMB (Windows, macOS) to these users,
        /// `NAME=rw` or `NAME=ro`: `--smb alice=rw bob=ro`, or repeated
        #[arg(long = "smb", value_name = "USER=rw|ro", num_args = 0..)]
        smb: Option<Vec<String>>,
        /// SMB: anyone may read without a password
        #[arg(long)]
        guest: bool,
        /// SMB: a Time Machine backup target for Macs
        #[arg(long)]
        timemachine: bool,
        /// SMB: the size Time Machine is shown and keeps its backups
        /// under (e.g. 500G); a hard limit is the dataset's quota
        #[arg(long, value_name = "SIZE", requires = "timemachine")]
        quota: Option<String>,
        /// SMB3 encryption of the share's traffic: off (when the client
        /// asks), desired or required
        #[arg(long, value_name = "MODE", default_value = "off")]
        smb_encrypt: String,
        /// SMB: refuse clients that do not sign their messages
        #[arg(long)]
        smb_signing_required: bool,
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

/// Parses `--iscsi IQN|auto[,chap=USER][,mutual=USER][,client=CIDR]...
/// [,initiator=NAME]...` (the daemon checks the values; an empty IQN asks
/// it to choose one).
fn parse_iscsi(spec: &str) -> anyhow::Result<IscsiShare> {
    let mut share = IscsiShare {
        iqn: String::new(),
        clients: Vec::new(),
        initiators: Vec::new(),
        chap: None,
        mutual_chap: None,
        read_only: false,
    };
    if spec.trim().is_empty() {
        bail!("--iscsi needs a target name or `auto`, then KEY=VALUE items");
    }
    let once = |slot: &mut Option<String>, k: &str, v: &str| -> anyhow::Result<()> {
        if slot.replace(v.to_string()).is_some() {
            bail!("--iscsi {spec}: {k}= is given twice");
        }
        Ok(())
    };
    for (n, part) in spec.split(',').enumerate() {
        let part = part.trim();
        match part.split_once('=') {
            None if n == 0 => {
                if part != "auto" {
                    share.iqn = part.to_string();
                }
            }
            None => {
                bail!("--iscsi {spec}: '{part}' is not KEY=VALUE (only the first item is a name)")
            }
            Some((k, "")) => bail!("--iscsi {spec}: {k}= needs a value"),
            Some(("chap", v)) => once(&mut share.chap, "chap", v)?,
            Some(("mutual", v)) => once(&mut share.mutual_chap, "mutual", v)?,
            Some(("client", v)) => share.clients.push(v.to_string()),
            Some(("initiator", v)) => share.initiators.push(v.to_string()),
            Some((k, _)) => {
                bail!("--iscsi {spec}: unknown key '{k}' (chap, mutual, client, initiator)")
            }
        }
    }
    Ok(share)
}

/// Reads a password: the first line of stdin with `from_stdin` or when
/// stdin is not a terminal, else from the terminal twice without echo.
fn read_password(from_stdin: bool) -> anyhow::Result<String> {
    read_secret(from_stdin, "Password")
}

/// Reads a secret called `what` the way [`read_password`] says.
fn read_secret(from_stdin: bool, what: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if from_stdin || !stdin.is_terminal() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdin.lock(), &mut line)?;
        let p = line.trim_end_matches(['\n', '\r']).to_string();
        if p.is_empty() {
            bail!("no {} on stdin", what.to_lowercase());
        }
        return Ok(p);
    }
    let first = prompt_hidden(&format!("{what}: "))?;
    let again = prompt_hidden("Again: ")?;
    if first != again {
        bail!("the two differ");
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

/// Parses `USER=rw|ro` arguments (a bare `USER` is `rw`) of `flag`.
fn user_access<'a>(
    flag: &str,
    args: impl IntoIterator<Item = &'a String>,
) -> anyhow::Result<BTreeMap<String, Access>> {
    let mut users = BTreeMap::new();
    for w in args {
        let (u, a) = w.split_once('=').unwrap_or((w.as_str(), "rw"));
        let access = match a {
            "rw" => Access::Rw,
            "ro" => Access::Ro,
            other => bail!("{flag} {w}: access must be rw or ro, not {other:?}"),
        };
        users.insert(u.to_string(), access);
    }
    Ok(users)
}

/// Parses a Time Machine quota: bytes, or a number with K, M, G, T or P
/// (powers of 1024), e.g. `500G`.
fn parse_quota(q: &str) -> anyhow::Result<u64> {
    let t = q.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches(['B', 'I'])
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        _ => bail!("--quota {q}: use a size like 500G (K, M, G, T, P)"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("--quota {q}: use a size like 500G"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| anyhow::anyhow!("--quota {q}: too large"))?;
    if bytes == 0 {
        bail!("--quota {q}: must be more than 0 (leave it out for no limit)");
    }
    Ok(bytes)
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
            smb,
            admin,
            name,
        } => {
            check_user_name(&name).map_err(anyhow::Error::msg)?;
            let password = read_password(password_stdin)?;
            let params = UserAddParams {
                pool: pool.clone(),
                name: name.clone(),
                password,
                uid,
                gid,
                smb,
            };
            client.call_quietly(out, method::USER_ADD, &params)?;
            if admin {
                let p = tarn_api::params::UserAdminParams { pool, name, admin };
                client.call_quietly(out, method::USER_ADMIN, &p)?;
            }
        }
        UserCommand::Admin { pool, name, state } => {
            let p = tarn_api::params::UserAdminParams {
                pool,
                name,
                admin: state == "on",
            };
            client.call_quietly(out, method::USER_ADMIN, &p)?;
        }
        UserCommand::Token(ApiTokenCommand::Add { pool, label, user }) => {
            let p = tarn_api::params::ApiTokenAddParams { label, user, pool };
            let v = client.call(method::API_TOKEN_ADD, &p)?;
            let t: tarn_api::params::TokenAdded = decode(method::API_TOKEN_ADD, v.clone())?;
            out.raw_or(&v, || format!("{}\n", t.token))?;
        }
        UserCommand::Token(ApiTokenCommand::List) => {
            let v = client.call(method::API_TOKEN_LIST, &NoParams {})?;
            let list: Vec<tarn_api::params::ApiTokenInfo> =
                decode(method::API_TOKEN_LIST, v.clone())?;
            out.raw_or(&v, || {
                let users: Vec<String> = list
                    .iter()
                    .map(|t| format!("{} ({})", t.user, t.pool))
                    .collect();
                let rows = list
                    .iter()
                    .zip(&users)
                    .map(|(t, u)| (t.label.as_str(), u.as_str(), t.created_unix));
                crate::render::token_table("USER (POOL)", rows)
            })?;
        }
        UserCommand::Token(ApiTokenCommand::Del { label }) => {
            client.call_quietly(
                out,
                method::API_TOKEN_DEL,
                &tarn_api::params::NameParams { name: label },
            )?;
        }
        UserCommand::Del { pool, name } => {
            client.call_quietly(out, method::USER_DEL, &UserParams { pool, name })?;
        }
        UserCommand::Passwd {
            pool,
            password_stdin,
            smb,
            no_smb,
            name,
        } => {
            let password = read_password(password_stdin)?;
            let params = UserPasswdParams {
                pool,
                name,
                password,
                smb: if smb {
                    Some(true)
                } else if no_smb {
                    Some(false)
                } else {
                    None
                },
            };
            client.call_quietly(out, method::USER_PASSWD, &params)?;
        }
        UserCommand::Chap {
            pool,
            secret_stdin,
            remove,
            name,
        } => {
            let secret = if remove {
                None
            } else {
                Some(read_secret(secret_stdin, "CHAP secret")?)
            };
            let params = UserChapParams { pool, name, secret };
            client.call_quietly(out, method::USER_CHAP, &params)?;
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
            iscsi,
            iscsi_ro,
            smb,
            guest,
            timemachine,
            quota,
            smb_encrypt,
            smb_signing_required,
        } => {
            let smb_on = smb.is_some() || guest || timemachine;
            let smb = if smb_on {
                Some(SmbShare {
                    users: user_access("--smb", smb.iter().flatten())?,
                    guest,
                    timemachine,
                    tm_quota: match quota {
                        Some(q) => parse_quota(&q)?,
                        None => 0,
                    },
                    encrypt: match smb_encrypt.as_str() {
                        "off" => SmbEncrypt::Off,
                        "desired" => SmbEncrypt::Desired,
                        "required" => SmbEncrypt::Required,
                        other => bail!("--smb-encrypt {other}: use off, desired or required"),
                    },
                    signing_required: smb_signing_required,
                })
            } else {
                if smb_encrypt != "off" || smb_signing_required {
                    bail!("--smb-encrypt and --smb-signing-required need --smb");
                }
                None
            };
            let users = user_access("--webdav", &webdav)?;
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
                iscsi: match iscsi {
                    Some(spec) => Some(IscsiShare {
                        read_only: iscsi_ro,
                        ..parse_iscsi(&spec)?
                    }),
                    None => None,
                },
                smb,
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

#[cfg(test)]
mod tests {
    use super::parse_iscsi;

    #[test]
    fn iscsi_specs_parse_or_say_why_not() {
        let s = parse_iscsi(
            "iqn.2026-11.org.example:vm1,chap=alice,mutual=box,client=10.0.0.0/8,\
             client=::1,initiator=iqn.1993-08.org.debian:01:a",
        )
        .unwrap();
        assert_eq!(s.iqn, "iqn.2026-11.org.example:vm1");
        assert_eq!(s.chap.as_deref(), Some("alice"));
        assert_eq!(s.mutual_chap.as_deref(), Some("box"));
        assert_eq!(s.clients, ["10.0.0.0/8", "::1"]);
        assert_eq!(s.initiators, ["iqn.1993-08.org.debian:01:a"]);
        let auto = parse_iscsi("auto,client=127.0.0.1").unwrap();
        assert_eq!(auto.iqn, "", "the daemon names it");
        assert_eq!(auto.clients, ["127.0.0.1"]);
        assert_eq!(
            parse_iscsi("chap=alice").unwrap().chap.as_deref(),
            Some("alice")
        );
        for bad in [
            "auto,iqn.x",
            "auto,chap=",
            "auto,secret=x",
            "auto,,",
            "",
            "auto,chap=a,chap=b",
        ] {
            assert!(parse_iscsi(bad).is_err(), "{bad}");
        }
    }
}

/// `tarn link ...`: share links of the web page (`/s/TOKEN`).
#[derive(Subcommand, Debug)]
pub enum LinkCommand {
    /// Make a link to a folder of a share, acting as a user who may use
    /// the share; the token is printed once (open
    /// `https://HOST:PORT/s/TOKEN` on the web page's server)
    Create {
        /// The user it acts as, `USER` or `POOL/USER`
        #[arg(long = "as", value_name = "USER")]
        owner: String,
        /// Visitors may only upload (and see nothing); otherwise read-only
        #[arg(long)]
        upload: bool,
        /// Ask visitors for a password, read from stdin (first line)
        #[arg(long)]
        password_stdin: bool,
        /// Stop working after this many days
        #[arg(long, value_name = "DAYS")]
        expires: Option<u64>,
        /// The share
        share: String,
        /// The folder, relative to the share's top [default: all of it]
        #[arg(default_value = "")]
        path: String,
    },
    /// The links (never their tokens)
    List,
    /// Revoke a link: it stops working at once
    #[command(alias = "rm")]
    Revoke {
        /// The link's id
        id: String,
    },
}

pub(crate) fn link_command(
    client: &mut Session,
    out: &Out,
    cmd: LinkCommand,
) -> anyhow::Result<()> {
    use tarn_api::params::{LinkCreateParams, LinkCreated, LinkInfo, NameParams};
    match cmd {
        LinkCommand::Create {
            owner,
            upload,
            password_stdin,
            expires,
            share,
            path,
        } => {
            let owner = if owner.contains('/') {
                owner
            } else {
                // A bare name: the pool of the share.
                let shares: Vec<tarn_api::access::ShareInfo> = decode(
                    method::SHARE_LIST,
                    client.call(method::SHARE_LIST, &NoParams {})?,
                )?;
                let Some(s) = shares.iter().find(|s| s.share.name == share) else {
                    bail!("no share '{share}'");
                };
                format!("{}/{owner}", s.pool)
            };
            let password = if password_stdin {
                Some(read_secret(true, "Password")?)
            } else {
                None
            };
            let p = LinkCreateParams {
                share,
                path,
                upload,
                password,
                expires_in_secs: expires.map(|d| d.saturating_mul(86_400)),
                owner: Some(owner),
            };
            let v = client.call(method::LINK_CREATE, &p)?;
            let made: LinkCreated = decode(method::LINK_CREATE, v.clone())?;
            out.raw_or(&v, || format!("{}\n", made.token))?;
        }
        LinkCommand::List => {
            let v = client.call(method::LINK_LIST, &NoParams {})?;
            let list: Vec<LinkInfo> = decode(method::LINK_LIST, v.clone())?;
            out.raw_or(&v, || {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|l| {
                        vec![
                            l.id.clone(),
                            format!("{}/{}", l.share, l.path),
                            if l.upload { "upload" } else { "read" }.to_string(),
                            l.owner.clone(),
                            if l.password { "yes" } else { "" }.to_string(),
                            l.expires_unix.map_or(String::new(), render::format_date),
                        ]
                    })
                    .collect();
                render::table(
                    &["ID", "SHARE/FOLDER", "MODE", "AS", "PASSWORD", "EXPIRES"],
                    &rows,
                    &[0, 1, 2, 3, 4, 5],
                )
            })?;
        }
        LinkCommand::Revoke { id } => {
            client.call_quietly(out, method::LINK_REVOKE, &NameParams { name: id })?;
        }
    }
    Ok(())
}
