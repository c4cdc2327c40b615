//! Which filesystem events (as `notify` reports them) say that a file in a watched directory is
//! complete: the filter the drop zone's and the store's watchers share.

/// Filesystem events after which a drop-zone file is complete: renamed in, or closed after
/// writing. A bare create is not one (the writer may still be writing).
pub fn is_ready_kind(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
    matches!(
        kind,
        notify::EventKind::Modify(ModifyKind::Name(
            RenameMode::To | RenameMode::Both | RenameMode::Any
        )) | notify::EventKind::Access(AccessKind::Close(AccessMode::Write))
            | notify::EventKind::Create(notify::event::CreateKind::Folder)
    )
}
