//! VT3_CMD_REREG_MR (`ibv_rereg_mr`): an MR's translation, PD or rights
//! changed in place, its STag kept (docs/rereg-mr.md). The
//! rules are the engine's (`vt3_iwarp::engine::check_rereg`), applied by
//! the TPT; here the command is decoded, the new page list read and the
//! budgets (page-list entries, PD users) moved from the old to the new.

use vm_memory::GuestMemory;
use vt3_iwarp::engine::{Registration, Rereg, ReregError, REREG_PD, REREG_TRANSLATION};

use super::tpt::Backing;
use super::{le, CmdResult, Rnic};
use crate::abi::{CmdReregMr, Status, VT3_PAGE_SIZE};

fn status(error: ReregError) -> Status {
    match error {
        ReregError::NoSuchMr(_) => Status::NotFound,
        ReregError::WindowsBound(_) => Status::Busy,
        ReregError::Kind(_) | ReregError::Change(_) | ReregError::Access(_) | ReregError::Translation { .. } => {
            Status::Invalid
        }
    }
}

impl Rnic {
    pub(super) fn rereg_mr<M: GuestMemory>(&mut self, mem: &M, a: &CmdReregMr) -> CmdResult {
        let stag = le(a.stag);
        let rereg = Rereg {
            change: le(a.change),
            new: Registration {
                pdn: le(a.pdn),
                access: le(a.access),
                iova: a.iova.to_native(),
                length: a.length.to_native(),
            },
            npages: le(a.npages),
            page_offset: u64::from(le(a.page_offset)),
        };
        // Every rule before the page list is read (and counted).
        self.tpt.check_rereg(stag, &rereg).map_err(status)?;
        let old_pdn = self.tpt.get(stag).map(|mr| mr.pdn).ok_or(Status::NotFound)?;
        let new_pdn = if rereg.change & REREG_PD != 0 { rereg.new.pdn } else { old_pdn };
        if self.pds.get(new_pdn).is_none() {
            return Err(Status::NotFound);
        }
        let backing = if rereg.change & REREG_TRANSLATION != 0 {
            if rereg.new.length > self.limits.max_mr_size || rereg.page_offset >= VT3_PAGE_SIZE {
                return Err(Status::Invalid);
            }
            let pages = self.read_pbl(mem, a.pbl_addr.to_native(), rereg.npages)?;
            Some(Backing::Pages { pages, page_offset: rereg.page_offset })
        } else {
            None
        };
        let release = backing.clone();
        match self.tpt.rereg(stag, &rereg, backing) {
            Ok(old) => {
                if let Some(old) = old {
                    self.release_pages(&old);
                }
                self.pd_users(old_pdn, false);
                self.pd_users(new_pdn, true);
                Ok(Vec::new())
            }
            Err(e) => {
                if let Some(new) = release {
                    self.release_pages(&new);
                }
                Err(status(e))
            }
        }
    }
}
