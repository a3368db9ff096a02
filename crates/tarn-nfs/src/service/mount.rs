//! MOUNT v3 (MNT, DUMP, UMNT, UMNTALL, EXPORT) and the portmapper's
//! NULL and GETPORT, answered with the server's own ports.

use super::*;

impl Service {
    // ----- portmapper ----------------------------------------------------

    pub(super) fn pmap(&self, proc_: u32, args: &[u8], xid: u32) -> Result<Writer, AcceptStat> {
        match proc_ {
            0 => Ok(rpc::accepted(xid, AcceptStat::Success)),
            3 => {
                let mut r = Reader::new(args);
                let m = (|| -> XdrResult<(u32, u32, u32)> {
                    let prog = r.u32()?;
                    let vers = r.u32()?;
                    let prot = r.u32()?;
                    r.u32()?;
                    Ok((prog, vers, prot))
                })()
                .map_err(|_| AcceptStat::GarbageArgs)?;
                let port = match m {
                    (NFS_PROG, 3, 6) => self.nfs_port,
                    (MOUNT_PROG, 3, 6) => self.mount_port,
                    _ => 0,
                };
                let mut w = rpc::accepted(xid, AcceptStat::Success);
                w.u32(u32::from(port));
                Ok(w)
            }
            _ => Err(AcceptStat::ProcUnavail),
        }
    }

    // ----- MOUNT v3 ------------------------------------------------------

    pub(super) fn mount(
        &self,
        caller: &Caller,
        auth: &Auth,
        proc_: u32,
        args: &[u8],
        xid: u32,
    ) -> Result<Writer, AcceptStat> {
        let mut r = Reader::new(args);
        let host = match auth {
            Auth::Sys(a) if !a.machine.is_empty() => {
                format!("{}", String::from_utf8_lossy(&a.machine))
            }
            _ => caller.peer.to_string(),
        };
        let mut w = rpc::accepted(xid, AcceptStat::Success);
        match proc_ {
            mountproc::NULL => {}
            mountproc::MNT => {
                let path = r.string(MNTPATHLEN).map_err(|_| AcceptStat::GarbageArgs)?;
                let path = normalize_path(&String::from_utf8_lossy(path));
                let entries = self.entries();
                let Some(e) = entries.iter().find(|e| e.export.path == path) else {
                    w.u32(mountstat::NOENT);
                    return Ok(w);
                };
                if !e.export.allows(caller.peer) {
                    w.u32(mountstat::ACCES);
                    return Ok(w);
                }
                // The root must still be readable; its handle is fixed.
                match e.export.fs.getattr(ROOT_INO) {
                    Ok(_) => {}
                    Err(err) => {
                        w.u32(mountstat::from_nfs(stat_of(&err).code()));
                        return Ok(w);
                    }
                };
                {
                    let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                    if !m.iter().any(|(h, p)| *h == host && *p == path) && m.len() < MAX_MOUNT_LIST
                    {
                        m.push((host, path));
                    }
                }
                w.u32(mountstat::OK);
                w.opaque(&handle::encode(&self.handle_key, &e.root));
                // Accepted flavors: AUTH_SYS, and AUTH_NONE (mapped to the
                // anonymous user).
                w.u32(2).u32(rpc::AUTH_SYS).u32(rpc::AUTH_NONE);
            }
            mountproc::DUMP => {
                let m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                for (h, p) in m.iter() {
                    w.bool(true).opaque(h.as_bytes()).opaque(p.as_bytes());
                }
                w.bool(false);
            }
            mountproc::UMNT => {
                let path = r.string(MNTPATHLEN).map_err(|_| AcceptStat::GarbageArgs)?;
                let path = normalize_path(&String::from_utf8_lossy(path));
                let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                m.retain(|(h, p)| !(*h == host && *p == path));
            }
            mountproc::UMNTALL => {
                let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                m.retain(|(h, _)| *h != host);
            }
            mountproc::EXPORT => {
                for e in self.entries().iter() {
                    w.bool(true).opaque(e.export.path.as_bytes());
                    for n in &e.export.clients {
                        w.bool(true).opaque(n.to_string().as_bytes());
                    }
                    w.bool(false);
                }
                w.bool(false);
            }
            _ => return Err(AcceptStat::ProcUnavail),
        }
        Ok(w)
    }
}
