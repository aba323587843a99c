//! Memory windows (RFC 5040 §2.1, the verbs' type 1 and type 2): the
//! rules of a bind and of an access through a window's STag, shared by
//! every TPT (the device's `rnic::tpt::Tpt` and [`crate::mock`]) so that
//! both apply the same ones. A TPT keeps a window as an entry of its own
//! index space (STag = index << 8 | key) and hands these functions a view
//! of it and of the region it is bound to.

use thiserror::Error;

use super::memory::{Access, AccessError, LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE};

/// The rights a window may grant: remote ones (a window is never an lkey).
pub const WINDOW_ACCESS: Access = REMOTE_READ | REMOTE_WRITE;
/// Rights a bind may name: the window's, plus LOCAL_WRITE, which the verbs
/// let applications pass and which a window ignores.
const BIND_ACCESS: Access = WINDOW_ACCESS | LOCAL_WRITE;

/// `enum vt3_mw_type` (the verbs' IBV_MW_TYPE_1 / _2, type 2 being the
/// QP-associated "2B" of the IB spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound through `ibv_bind_mw` to the PD; rebound at will; never
    /// invalidated by LOCAL_INV or the peer (a zero-length bind unbinds it).
    One = 1,
    /// Bound by a BIND_MW work request to the posting QP; bound again only
    /// once invalidated (LOCAL_INV, the peer's Send with Invalidate).
    Two = 2,
}

impl MwType {
    pub fn from_wire(value: u8) -> Option<MwType> {
        match value {
            1 => Some(MwType::One),
            2 => Some(MwType::Two),
            _ => None,
        }
    }
}

/// A BIND_MW work request (`struct vt3_bind_mw_wqe`): window `mw_stag`
/// (its index, its new key) over `[addr, addr + length)` of region
/// `mr_stag`, granting `access`; `mw_type` is the type the poster meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    pub mw_stag: u32,
    pub mr_stag: u32,
    pub addr: u64,
    pub length: u64,
    pub access: Access,
    pub mw_type: MwType,
}

impl Default for MwBind {
    fn default() -> Self {
        MwBind { mw_stag: 0, mr_stag: 0, addr: 0, length: 0, access: 0, mw_type: MwType::Two }
    }
}

/// Who accesses the TPT: the QP's protection domain and the QP itself
/// (a type 2 window answers to the QP it was bound on only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    pub pdn: u32,
    pub qpn: u32,
}

/// What a TPT stores for a window besides the fields a region has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub mw_type: MwType,
    /// The region it is bound to, by STag (a region re-registered under a
    /// new key, or gone, leaves the window naming nothing).
    pub mr_stag: u32,
    /// Type 2: the QP it was bound on.
    pub qpn: u32,
}

/// A window entry as [`check_bind`] and [`check_window_access`] see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    pub window: Window,
    pub pdn: u32,
    pub key: u8,
    pub valid: bool,
    pub access: Access,
    pub iova: u64,
    pub length: u64,
}

/// The region a bind names, as [`check_bind`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionView {
    pub pdn: u32,
    pub access: Access,
    pub iova: u64,
    pub length: u64,
}

/// Why a bind was refused: its WQE completes with MW_BIND_ERR and the QP
/// goes to ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum BindError {
    #[error("STag {0:#x} names no memory window")]
    NoSuchWindow(u32),
    #[error("the window is of type {actual:?}, the request is for {requested:?}")]
    WrongType { actual: MwType, requested: MwType },
    #[error("the window belongs to another protection domain than the QP")]
    WindowPd,
    #[error("a type 2 window is bound until it is invalidated")]
    StillBound,
    #[error("key {0:#04x} is the window's current key: a bind must rotate it")]
    SameKey(u8),
    #[error("access bits {0:#x} are not a window's")]
    Access(Access),
    #[error("STag {0:#x} names no valid memory region")]
    NoSuchRegion(u32),
    #[error("the region belongs to another protection domain than the QP")]
    RegionPd,
    #[error("the region was registered without MW_BIND")]
    NoBindRight,
    #[error("remote write through a window needs the region's local write")]
    NoLocalWrite,
    #[error("the window does not lie within the region")]
    Bounds,
}

/// Checks `bind`, posted on `owner`'s QP, against the window it names and
/// the region it binds (`None`: no valid region under `bind.mr_stag`).
/// Zero-length binds name no region (the verbs allow a NULL MR there).
pub fn check_bind(
    bind: &MwBind,
    owner: Owner,
    window: Option<&WindowView>,
    region: Option<&RegionView>,
) -> Result<(), BindError> {
    let window = window.ok_or(BindError::NoSuchWindow(bind.mw_stag))?;
    if window.window.mw_type != bind.mw_type {
        return Err(BindError::WrongType { actual: window.window.mw_type, requested: bind.mw_type });
    }
    if window.pdn != owner.pdn {
        return Err(BindError::WindowPd);
    }
    if window.window.mw_type == MwType::Two && window.valid {
        return Err(BindError::StillBound);
    }
    let key = (bind.mw_stag & 0xff) as u8;
    if key == window.key {
        return Err(BindError::SameKey(key));
    }
    if bind.access & !BIND_ACCESS != 0 {
        return Err(BindError::Access(bind.access));
    }
    if bind.length == 0 {
        return Ok(());
    }
    let region = region.ok_or(BindError::NoSuchRegion(bind.mr_stag))?;
    if region.pdn != owner.pdn {
        return Err(BindError::RegionPd);
    }
    if region.access & super::memory::MW_BIND == 0 {
        return Err(BindError::NoBindRight);
    }
    if bind.access & REMOTE_WRITE != 0 && region.access & LOCAL_WRITE == 0 {
        return Err(BindError::NoLocalWrite);
    }
    let within = bind.addr >= region.iova
        && bind
            .addr
            .checked_add(bind.length)
            .zip(region.iova.checked_add(region.length))
            .is_some_and(|(end, region_end)| end <= region_end);
    if !within {
        return Err(BindError::Bounds);
    }
    Ok(())
}

/// What a window entry becomes once `bind` passed [`check_bind`]: valid
/// over the bound range with its remote rights, except a zero-length bind
/// of a type 1 window, which unbinds it (the IB spec's way to invalidate
/// one). Returns (valid, access, iova, length, window).
pub fn bound_state(bind: &MwBind, owner: Owner) -> (bool, Access, u64, u64, Window) {
    let window = Window { mw_type: bind.mw_type, mr_stag: bind.mr_stag, qpn: owner.qpn };
    let valid = bind.length > 0 || bind.mw_type == MwType::Two;
    (valid, bind.access & WINDOW_ACCESS, bind.addr, bind.length, window)
}

/// Checks an access through a window's STag as RFC 5040 checks one through
/// a region's (state, PD, and for type 2 the QP, then rights and bounds)
/// and returns the region STag to translate through. Only the peer reaches
/// memory through a window: a local use (no remote right asked) is an
/// invalid STag, as for any STag the QP may not use.
pub fn check_window_access(
    window: &WindowView,
    owner: Owner,
    iova: u64,
    len: u64,
    needed: Access,
) -> Result<u32, AccessError> {
    if !window.valid || needed & WINDOW_ACCESS == 0 {
        return Err(AccessError::InvalidStag);
    }
    if window.pdn != owner.pdn {
        return Err(AccessError::WrongPd);
    }
    if window.window.mw_type == MwType::Two && window.window.qpn != owner.qpn {
        return Err(AccessError::WrongQp);
    }
    if window.access & needed != needed {
        return Err(AccessError::Rights);
    }
    let offset = iova.checked_sub(window.iova).ok_or(AccessError::Bounds)?;
    let end = offset.checked_add(len).ok_or(AccessError::Bounds)?;
    if end > window.length {
        return Err(AccessError::Bounds);
    }
    Ok(window.window.mr_stag)
}

/// LOCAL_INV and the peer's Send with Invalidate of a window: type 2 only
/// (a type 1 window may not be invalidated: `Rights`), of the QP's PD.
pub fn check_window_invalidate(window: &WindowView, pdn: u32) -> Result<(), AccessError> {
    if window.pdn != pdn {
        return Err(AccessError::WrongPd);
    }
    if window.window.mw_type == MwType::One {
        return Err(AccessError::Rights);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const OWNER: Owner = Owner { pdn: 1, qpn: 7 };

    fn window(mw_type: MwType, valid: bool) -> WindowView {
        WindowView {
            window: Window { mw_type, mr_stag: 0x200 | 3, qpn: 7 },
            pdn: 1,
            key: 5,
            valid,
            access: REMOTE_WRITE,
            iova: 0x1000,
            length: 0x100,
        }
    }

    const REGION: RegionView =
        RegionView { pdn: 1, access: LOCAL_WRITE | super::super::memory::MW_BIND, iova: 0x1000, length: 0x1000 };

    fn bind(mw_type: MwType) -> MwBind {
        MwBind {
            mw_stag: 0x100 | 6,
            mr_stag: 0x200 | 3,
            addr: 0x1800,
            length: 0x800,
            access: REMOTE_WRITE | REMOTE_READ | LOCAL_WRITE,
            mw_type,
        }
    }

    #[test]
    fn every_bind_rule() {
        let w1 = window(MwType::One, true);
        let w2 = window(MwType::Two, false);
        let check = |b: MwBind, w: &WindowView, r: Option<&RegionView>| check_bind(&b, OWNER, Some(w), r);
        assert_eq!(check(bind(MwType::One), &w1, Some(&REGION)), Ok(()), "type 1 rebinds while bound");
        assert_eq!(check(bind(MwType::Two), &w2, Some(&REGION)), Ok(()));
        assert_eq!(check_bind(&bind(MwType::Two), OWNER, None, Some(&REGION)), Err(BindError::NoSuchWindow(0x106)));
        assert!(matches!(check(bind(MwType::Two), &w1, Some(&REGION)), Err(BindError::WrongType { .. })));
        let other_pd = Owner { pdn: 2, ..OWNER };
        assert_eq!(check_bind(&bind(MwType::Two), other_pd, Some(&w2), Some(&REGION)), Err(BindError::WindowPd));
        assert_eq!(check(bind(MwType::Two), &window(MwType::Two, true), Some(&REGION)), Err(BindError::StillBound));
        assert_eq!(
            check(MwBind { mw_stag: 0x105, ..bind(MwType::Two) }, &w2, Some(&REGION)),
            Err(BindError::SameKey(5))
        );
        assert_eq!(check(MwBind { access: 8, ..bind(MwType::Two) }, &w2, Some(&REGION)), Err(BindError::Access(8)));
        assert_eq!(check(bind(MwType::Two), &w2, None), Err(BindError::NoSuchRegion(0x203)));
        assert_eq!(check(MwBind { length: 0, ..bind(MwType::Two) }, &w2, None), Ok(()), "zero length: no region");
        assert_eq!(check(bind(MwType::Two), &w2, Some(&RegionView { pdn: 2, ..REGION })), Err(BindError::RegionPd));
        assert_eq!(
            check(bind(MwType::Two), &w2, Some(&RegionView { access: LOCAL_WRITE | REMOTE_WRITE, ..REGION })),
            Err(BindError::NoBindRight)
        );
        let no_lw = RegionView { access: super::super::memory::MW_BIND | REMOTE_READ, ..REGION };
        assert_eq!(check(bind(MwType::Two), &w2, Some(&no_lw)), Err(BindError::NoLocalWrite));
        assert_eq!(
            check(MwBind { access: REMOTE_READ, ..bind(MwType::Two) }, &w2, Some(&no_lw)),
            Ok(()),
            "read needs no local write"
        );
        assert_eq!(check(MwBind { addr: 0xfff, ..bind(MwType::Two) }, &w2, Some(&REGION)), Err(BindError::Bounds));
        assert_eq!(check(MwBind { addr: 0x1801, ..bind(MwType::Two) }, &w2, Some(&REGION)), Err(BindError::Bounds));
        assert_eq!(check(MwBind { addr: u64::MAX, ..bind(MwType::Two) }, &w2, Some(&REGION)), Err(BindError::Bounds));
    }

    #[test]
    fn bound_state_unbinds_type_1_on_zero_length() {
        let zero = MwBind { length: 0, ..bind(MwType::One) };
        assert!(!bound_state(&zero, OWNER).0);
        let zero2 = MwBind { length: 0, ..bind(MwType::Two) };
        assert!(bound_state(&zero2, OWNER).0, "a type 2 window is bound with zero length");
        let (valid, access, iova, length, w) = bound_state(&bind(MwType::Two), OWNER);
        assert_eq!((valid, access, iova, length, w.qpn), (true, REMOTE_WRITE | REMOTE_READ, 0x1800, 0x800, 7));
    }

    #[test]
    fn window_access_rules() {
        let w2 = window(MwType::Two, true);
        assert_eq!(check_window_access(&w2, OWNER, 0x1000, 0x100, REMOTE_WRITE), Ok(0x203));
        assert_eq!(
            check_window_access(&w2, OWNER, 0x1000, 0x100, LOCAL_WRITE),
            Err(AccessError::InvalidStag),
            "no lkey"
        );
        assert_eq!(
            check_window_access(&window(MwType::Two, false), OWNER, 0x1000, 1, REMOTE_WRITE),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(
            check_window_access(&w2, Owner { pdn: 2, qpn: 7 }, 0x1000, 1, REMOTE_WRITE),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            check_window_access(&w2, Owner { pdn: 1, qpn: 8 }, 0x1000, 1, REMOTE_WRITE),
            Err(AccessError::WrongQp)
        );
        assert_eq!(
            check_window_access(&window(MwType::One, true), Owner { pdn: 1, qpn: 8 }, 0x1000, 1, REMOTE_WRITE),
            Ok(0x203),
            "type 1: any QP of the PD"
        );
        assert_eq!(check_window_access(&w2, OWNER, 0x1000, 1, REMOTE_READ), Err(AccessError::Rights));
        assert_eq!(check_window_access(&w2, OWNER, 0xfff, 1, REMOTE_WRITE), Err(AccessError::Bounds));
        assert_eq!(check_window_access(&w2, OWNER, 0x1000, 0x101, REMOTE_WRITE), Err(AccessError::Bounds));
        assert_eq!(check_window_invalidate(&window(MwType::One, true), 1), Err(AccessError::Rights));
        assert_eq!(check_window_invalidate(&w2, 2), Err(AccessError::WrongPd));
        assert_eq!(check_window_invalidate(&w2, 1), Ok(()));
    }
}
