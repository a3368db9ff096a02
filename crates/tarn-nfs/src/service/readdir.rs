//! Listing directories: READDIR and READDIRPLUS, with cookies that are
//! keys of the directory's tree.

use super::wire::*;
use super::*;

impl<'a> Cx<'a> {
    /// The cookie verifier: cookies are keys in the directory's tree and
    /// never go stale, so it is a constant of the dataset (stable across
    /// restarts).
    pub(super) fn cookieverf(guid: u64) -> [u8; 8] {
        (guid ^ 0x7461_726e_6e66_7333).to_be_bytes()
    }

    pub(super) fn readdir(&self, r: &mut Reader, w: &mut Writer, plus: bool) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let cookie = r.u64()?;
        let verf = r.fixed(8)?;
        let (dircount, maxcount) = if plus {
            (r.u32()? as usize, r.u32()? as usize)
        } else {
            let c = r.u32()? as usize;
            (c, c)
        };
        let maxcount = maxcount.min(self.svc.max_io as usize);
        let dircount = dircount.min(maxcount);
        let Some(d) = self.resolve_or(fh, w, NoAttrs::PostOp) else {
            return Ok(());
        };
        let myverf = Self::cookieverf(d.entry.guid);
        let fail = |w: &mut Writer, s: NfsStat| {
            w.u32(s.code());
            post_op_attr(w, Some(&d.attr));
        };
        if d.attr.kind != FileKind::Directory {
            fail(w, NfsStat::NotDir);
            return Ok(());
        }
        if cookie != 0 && verf != [0u8; 8] && verf != myverf {
            fail(w, NfsStat::BadCookie);
            return Ok(());
        }
        if let Err(e) = d.fs().access(d.ino(), R_OK, &d.cred) {
            fail(w, stat_of(&e));
            return Ok(());
        }
        // Reading a directory lists its names; its entries' attributes and
        // handles are what a lookup gives, which needs search permission
        // too (as Linux's nfsd answers): without it, names only.
        let searchable = !plus || d.fs().access(d.ino(), X_OK, &d.cred).is_ok();
        // Reply overhead: status, dir attributes, verifier, list end, eof.
        let overhead = 4 + POST_OP_ATTR_LEN + 8 + 4 + 4;
        let per_entry_min = if plus {
            24 + 4 + POST_OP_ATTR_LEN + 8 + HANDLE_LEN
        } else {
            24 + 4
        };
        let limit = (maxcount.saturating_sub(overhead) / per_entry_min).clamp(1, MAX_DIR_BATCH);
        // READDIRPLUS pages end where the next entry would not fit: a name
        // is longer than `per_entry_min` assumes, and an entry listed but
        // cut off below would have had its inode read and its handle made
        // for nothing (a fifteenth of a page of short names).
        let mut refused = false;
        let (mut est, mut est_dir) = (overhead, 0usize);
        let mut fits = |e: Option<&tarn_fs::DirEntry>| {
            let Some(e) = e else {
                (refused, est, est_dir) = (false, overhead, 0);
                return true;
            };
            let dir_bytes = entry_dir_len(e.name.len());
            let len = 4 + dir_bytes + POST_OP_ATTR_LEN + 4 + 4 + HANDLE_LEN;
            if est + len > maxcount || est_dir + dir_bytes > dircount {
                refused = true;
                return false;
            }
            (est, est_dir) = (est + len, est_dir + dir_bytes);
            true
        };
        // Kept as listed: reshaping every entry moves hundreds of bytes each.
        // A read-only export changes nothing, access times included.
        let atime = !d.entry.export.read_only;
        let listed: Result<Listed, FsError> = if plus {
            d.fs()
                .readdirplus_fitting(d.ino(), cookie, limit, atime, &mut fits)
                .map(Listed::Plus)
        } else {
            d.fs()
                .readdir_with(d.ino(), cookie, limit, atime)
                .map(Listed::Names)
        };
        let listed = match listed {
            Ok(l) => l,
            Err(e) => {
                fail(w, stat_of(&e));
                return Ok(());
            }
        };
        let fetched = listed.len();
        // Entries go straight into the reply after its head; one that does
        // not fit is cut off again.
        let start = w.len();
        w.u32(0);
        post_op_attr(w, d.reattr().as_ref().or(Some(&d.attr)));
        w.fixed(&myverf);
        w.reserve((fetched * (per_entry_min + 16)).min(maxcount));
        let mut used = overhead;
        let mut dir_used = 0usize;
        let mut taken = 0usize;
        for i in 0..fetched {
            let (e, a) = listed.get(i);
            let mark = w.len();
            w.bool(true).u64(e.ino).opaque(&e.name).u64(e.cookie);
            let dir_bytes = w.len() - mark - 4;
            debug_assert_eq!(dir_bytes, entry_dir_len(e.name.len()));
            if plus {
                let a = a.filter(|_| searchable);
                post_op_attr(w, a);
                match a {
                    Some(a) => {
                        w.bool(true).opaque(&self.svc.handle_bytes(a));
                    }
                    None => {
                        w.bool(false);
                    }
                }
            }
            let len = w.len() - mark;
            if used + len > maxcount || (plus && dir_used + dir_bytes > dircount) {
                w.truncate(mark);
                break;
            }
            used += len;
            dir_used += dir_bytes;
            taken += 1;
        }
        if taken == 0 && (fetched > 0 || refused) {
            w.truncate(start);
            fail(w, NfsStat::TooSmall);
            return Ok(());
        }
        let eof = taken == fetched && fetched < limit && !refused;
        w.bool(false).bool(eof);
        Ok(())
    }
}

/// Bytes of an entry's `fileid`, name and cookie in a reply: what
/// READDIRPLUS's `dircount` counts.
fn entry_dir_len(name_len: usize) -> usize {
    8 + 4 + name_len.next_multiple_of(4) + 8
}

/// A page of a directory as the file system listed it.
enum Listed {
    Plus(Vec<(tarn_fs::DirEntry, Attr)>),
    Names(Vec<tarn_fs::DirEntry>),
}

impl Listed {
    fn len(&self) -> usize {
        match self {
            Listed::Plus(v) => v.len(),
            Listed::Names(v) => v.len(),
        }
    }

    /// Entry `i` (below `len`) and its attributes, if listed with them.
    fn get(&self, i: usize) -> (&tarn_fs::DirEntry, Option<&Attr>) {
        match self {
            Listed::Plus(v) => (&v[i].0, Some(&v[i].1)),
            Listed::Names(v) => (&v[i], None),
        }
    }
}
