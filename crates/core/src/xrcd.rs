//! XRC domains (docs/design/xrc-semantics.md §1.1): shared by file identity, counted globally
//! (`opens + SRQs + receive QPs`) and per handle (what was made through it).

use serde::{Deserialize, Serialize};

use crate::core::{Core, Xrcd, XrcdHandle};
use crate::errno::{O_CREAT, O_EXCL};
use crate::error::{Error, ObjectKind, Result};
use crate::ids::{CtxId, FileId, Handle, XrcdId};
use crate::limits::Resource;

/// What `open_xrcd` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XrcdOpened {
    /// The caller's new handle (every open gets its own, also of an existing domain).
    pub handle: Handle,
    /// The domain behind it, for introspection.
    pub xrcd: XrcdId,
    /// True if this open created the domain.
    pub created: bool,
}

impl Core {
    /// `ibv_open_xrcd`. `file` is the identity of the fd the client passed, or `None` for
    /// `fd == -1`, which always makes a new private domain nobody else can find.
    ///
    /// Rules of uverbs `ib_uverbs_open_xrcd`: a file with no domain and no `O_CREAT` in
    /// `oflags` is `EAGAIN`; a file that has a domain and `O_EXCL` is `EINVAL` (with or
    /// without `O_CREAT`, as upstream checks). Other `oflags` bits are ignored.
    pub fn open_xrcd(
        &mut self,
        ctx: CtxId,
        file: Option<FileId>,
        oflags: u32,
    ) -> Result<XrcdOpened> {
        let dev = self.ctx(ctx)?.device;
        self.admit(ctx, Resource::Xrcds, 1)?;
        let existing = file.and_then(|f| self.xrcd_by_file.get(&(dev, f)).copied());
        let (xrcd, created) = match (existing, file) {
            (Some(_), _) if oflags & O_EXCL != 0 => return Err(Error::XrcdExists),
            (Some(id), _) => (id, false),
            (None, Some(_)) if oflags & O_CREAT == 0 => return Err(Error::XrcdNeedsCreate),
            (None, _) => {
                let id = XrcdId(self.next_xrcd);
                self.next_xrcd += 1;
                self.xrcds.insert(
                    id,
                    Xrcd {
                        device: dev,
                        file,
                        opens: 0,
                        srqs: 0,
                        tgt_qps: 0,
                    },
                );
                if let Some(f) = file {
                    self.xrcd_by_file.insert((dev, f), id);
                }
                (id, true)
            }
        };
        let handle = self.new_handle(ctx)?;
        self.xrcds
            .get_mut(&xrcd)
            .expect("found or created above")
            .opens += 1;
        self.ctx_mut(ctx)?
            .xrcds
            .insert(handle, XrcdHandle { xrcd, refcnt: 0 });
        self.add_usage(ctx, Resource::Xrcds, 1);
        Ok(XrcdOpened {
            handle,
            xrcd,
            created,
        })
    }

    /// `ibv_close_xrcd`: `EBUSY` while SRQs, receive-QP handles or registrations made through
    /// this handle remain. Otherwise drops this open; the domain itself goes when its count
    /// of opens, SRQs and receive QPs reaches zero.
    pub fn close_xrcd(&mut self, ctx: CtxId, xrcd_handle: Handle) -> Result<()> {
        let c = self.ctx_mut(ctx)?;
        let h = c
            .xrcds
            .get(&xrcd_handle)
            .ok_or(Error::UnknownHandle(ObjectKind::Xrcd))?;
        if h.refcnt > 0 {
            return Err(Error::Busy(
                ObjectKind::Xrcd,
                "SRQs or receive QPs still use this handle",
            ));
        }
        let xrcd = h.xrcd;
        c.xrcds.remove(&xrcd_handle);
        self.uncharge(ctx, Resource::Xrcds, 1);
        self.release_xrcd_count(xrcd, |x| x.opens -= 1);
        Ok(())
    }

    /// Drops one part of a domain's count and frees the domain (and its file entry) when
    /// nothing is left.
    pub(crate) fn release_xrcd_count(&mut self, xrcd: XrcdId, drop_one: impl FnOnce(&mut Xrcd)) {
        let Some(x) = self.xrcds.get_mut(&xrcd) else {
            return;
        };
        drop_one(x);
        if x.usecnt() == 0 {
            let x = self.xrcds.remove(&xrcd).expect("present above");
            if let Some(f) = x.file {
                self.xrcd_by_file.remove(&(x.device, f));
            }
        }
    }

    /// The domain behind one of the context's XRCD handles.
    pub fn xrcd_of_handle(&self, ctx: CtxId, xrcd_handle: Handle) -> Result<XrcdId> {
        Ok(self
            .ctx(ctx)?
            .xrcds
            .get(&xrcd_handle)
            .ok_or(Error::InvalidHandle(ObjectKind::Xrcd))?
            .xrcd)
    }
}
