"""A campaign's finished work as one file per host, which a repository carries to the next machine.

    restore(jobs, root, stores, Path("campaigns/value-transfer"), tracking_uri)   # before run_campaign
    pack(jobs, root, stores, Path("campaigns/value-transfer"))                    # after it

A campaign of hours outlives the machine it started on only through what is committed: a sitting's
stores, run folders and MLflow database may be gone at the next. `pack` writes
`<folder>/<host key>.tar.xz`: the campaign's finished jobs' folders, and those of the last archive
that no job of the call names (relative to `root`, without
their locks, search state and built libraries) and a compact copy of every store (`copy_store` into
an empty sqlite file), with a manifest naming the host and each folder's files. A file's content is
packed once however many folders hold it (runs of one network carry the same MetaSchedule workload
database), and xz's large window shares what similar files have in common, so a campaign of a
hundred runs stays a few megabytes a commit. `restore` reads the archive of this host's kind
only (its own key, or an archive host's whose flags differ from its own only in NEUTRAL_FLAGS:
`campaign_identity`), so readings and runs of one CPU are never mixed with another's: it copies the stores' rows
into the local stores (`copy_store`: rows already held are skipped), puts back the finished folders
this machine lacks (a local folder always wins), and rebuilds each restored run's MLflow run from
its records (`tuning.tools.sync`), so the tables that read MLflow find them.

`open_view(path, views)` reads one named archive of any host for its tables: into a folder of its
own (views/<campaign>/<host key>/: runs/, stores/, mlflow.db), never into this host's campaign, stores
or MLflow store, and it measures and packs nothing. So a finished campaign's tables can be printed
again on any machine from a clone, while its readings stay its host's. The experiments take it as
`--table-only --archive FOLDER/<host key>.tar.xz` (`view_for_tables`).

A job whose output lives elsewhere (`Job.archived=False`: a model registered in MLflow) is not
packed; a restored campaign runs it again. The archive is untrusted input: only regular files under
the manifest's folders and stores are extracted, the stores' rows pass copy_store's checks, and
a file whose content does not match its hash is refused; every file is read and checked before any
folder is put in place. Its size is capped before anything is written, from the tar headers and the
manifest: MAX_FILE_BYTES a member, MAX_FILES members and files put in place, MAX_ARCHIVE_BYTES of
members and MAX_RESTORED_BYTES put in place; a view that fails leaves nothing in the views folder.
Archives of the first format (`.tar.gz`, every file under `runs/`) are still read, and the next
pack replaces them.
"""
from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tuning.cluster.host_identity import (  # noqa: F401 - also this module's names from before
    NEUTRAL_FLAGS,
    equivalent_identities,
    host_identity,
    host_key,
    packing_host,
)
from tuning.tools.campaign import Job, is_finished

MANIFEST = "manifest.json"
FORMAT = 2  # 1: tar.gz, each folder's files under runs/; 2: tar.xz, files by content hash under blobs/
READABLE = {1, 2}
SUFFIX = {1: ".tar.gz", 2: ".tar.xz"}
XZ_PRESET = 9  # a 64 MiB window: similar files (each run's tuning records) compress against each other
LEFT_OUT = {".tunelab.lock"}  # a finished folder's files not worth carrying
LEFT_OUT_FOLDERS = {"state", "export"}  # search state (a finished run resumes nothing), built libraries
MAX_FILE_BYTES = 64 << 20  # per extracted file: an archive is a repository's file, not a dump
# A whole archive's caps. The largest campaign so far, value-transfer (2,472 members of 144 MiB that place
# 3,111 files of 283 MiB), is well within them; ten 60 MiB blobs from a 94 KB file are not.
MAX_ARCHIVE_BYTES = 512 << 20  # its members together: what a restore reads into scratch
MAX_RESTORED_BYTES = 1 << 30  # the files put in place (a blob counts once for each file that names it)
MAX_FILES = 20_000  # its members, and the files put in place
UNREADABLE = (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error)  # what a broken archive raises


class ArchiveError(ValueError):
    """An archive that cannot be read or does not belong to this host."""


@dataclass
class Restored:
    folders: list[str] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)  # every folder the archive holds, here now or before
    stores: list[str] = field(default_factory=list)  # the archive's store file names
    kept_local: int = 0
    readings: int = 0
    synced: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"restored {len(self.folders)} finished folders ({self.kept_local} already here kept), "
                f"{self.readings:,} store readings, {self.synced} runs re-logged to MLflow"
                + "".join(f"; {p}" for p in self.problems))


def archive_path(folder: Path, identity: dict | None = None, version: int = FORMAT) -> Path:
    return folder / f"{host_key(identity or host_identity())}{SUFFIX[version]}"


def _existing_archive(folder: Path, identity: dict) -> Path | None:
    """This host's archive, the newest format first."""
    for version in sorted(READABLE, reverse=True):
        if (path := archive_path(folder, identity, version)).is_file():
            return path
    return None


def campaign_identity(folder: Path) -> tuple[dict, str]:
    """The identity under which this host continues the campaign in `folder`: its own, or that of an
    archive of its kind (`equivalent_identities`); and a note on what that choice means."""
    own, *others = equivalent_identities()
    if _existing_archive(folder, own) is None:
        for identity in others:
            if _existing_archive(folder, identity) is not None:
                return identity, (f"this host ({host_key(own)}) differs from {host_key(identity)} only in flags "
                                  f"that do not change how code runs ({', '.join(sorted(NEUTRAL_FLAGS))}): "
                                  f"it continues that archive")
        alike = sorted(p.name for p in folder.glob(f"{host_key(own).rsplit('-', 1)[0]}-*.tar.*")) if folder.is_dir() else []
        if alike:
            return own, (f"{', '.join(alike)}: the same CPU model and cores as this host ({host_key(own)}) but other "
                         "flags; not continued here (a new replicate starts)")
    return own, ""


# ---- pack --------------------------------------------------------------------------------------------
def pack(jobs: list[Job], root: Path, stores: list[Path], folder: Path, identity: dict | None = None,
         kept: list[str] = ()) -> Path:
    """This host's archive of the campaign's finished jobs and its stores, replacing the last one.

    `kept`: the last archive's folders (`Restored.listed`). Those that no job of this call names are
    packed again as they are here, so a call that runs part of a campaign (`--blocks size2048`) does
    not drop the folders of the parts it did not run."""
    identity = identity or host_identity()
    names = [Path(s).name for s in stores]
    if len(set(names)) != len(names):
        raise ArchiveError(f"stores: two share a file name ({', '.join(names)}); an archive keeps one of each")
    named = {_relative(job.folder, root) for job in jobs if job.archived}
    relative = [_relative(job.folder, root) for job in jobs if job.archived and is_finished(job)]
    relative += [rel for rel in dict.fromkeys(kept) if rel not in named and (root / rel).is_dir()]
    folders = [root / rel for rel in relative]
    target = archive_path(folder, identity)
    folder.mkdir(parents=True, exist_ok=True)
    files, blobs = _contents(folders, relative)
    with tempfile.TemporaryDirectory() as scratch:
        partial = Path(scratch) / target.name
        with tarfile.open(partial, "w:xz", preset=XZ_PRESET) as tar:
            manifest = {"format": FORMAT, "host": identity, "folders": relative, "files": files,
                        "stores": [n for s, n in zip(stores, names) if Path(s).is_file()],
                        "packed_on": packing_host()}
            _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
            for digest, file in sorted(blobs.items(), key=lambda item: (item[1].name, item[0])):
                tar.add(file, f"blobs/{digest}", recursive=False)  # like-named files side by side for xz
            for store, name in zip(stores, names):
                if Path(store).is_file():
                    tar.add(_compact_copy(Path(store), Path(scratch)), f"stores/{name}", recursive=False)
        shutil.move(partial, target)
    for version in READABLE - {FORMAT}:
        archive_path(folder, identity, version).unlink(missing_ok=True)  # replaced by this one
    return target


def _contents(folders: list[Path], relative: list[str]) -> tuple[dict, dict]:
    """Each folder's files as {folder: {file: content hash}}, and one path per distinct content."""
    files, blobs = {}, {}
    for path, rel in zip(folders, relative):
        files[rel] = {}
        for file in sorted(_carried_files(path)):
            digest = _sha256(file)
            files[rel][file.relative_to(path).as_posix()] = digest
            blobs.setdefault(digest, file)
    return files, blobs


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise ArchiveError(f"{path}: not under the campaign folder {root}") from None


def _carried_files(folder: Path):
    for parent, subfolders, files in os.walk(folder):
        subfolders[:] = [s for s in subfolders if s not in LEFT_OUT_FOLDERS]
        for name in files:
            path = Path(parent) / name
            if name not in LEFT_OUT and path.is_file() and not path.is_symlink() and not name.endswith(".so"):
                yield path


def _compact_copy(store: Path, scratch: Path) -> Path:
    from tuning.store import copy_store, open_store

    copy = scratch / f"compact-{store.name}"
    source, target = open_store(store, "--stores", read_only=True), open_store(copy, "archive")
    try:
        copy_store(source, target)
    finally:
        source.close()
        target.close()  # checkpoints the write-ahead log into the one file the archive carries
    return copy


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# ---- restore -----------------------------------------------------------------------------------------
def restore(root: Path, stores_folder: Path, folder: Path, tracking_uri: str | None,
            identity: dict | None = None) -> Restored | None:
    """This host's archive, when there is one, merged into the local campaign (see the module's doc)."""
    identity = identity or host_identity()
    path = _existing_archive(folder, identity)
    return None if path is None else _restore_file(path, root, stores_folder, tracking_uri, identity)


def _restore_file(path: Path, root: Path, stores_folder: Path, tracking_uri: str | None, identity: dict,
                  relog: bool = True) -> Restored:
    restored = Restored()
    try:
        with tarfile.open(path, "r:*") as tar, tempfile.TemporaryDirectory() as scratch:
            members = _members(tar, path)  # the caps, from the headers alone: nothing is read or written yet
            manifest = _manifest(tar, path, identity)
            restored.listed = list(dict.fromkeys(manifest["folders"]))
            wanted = [rel for rel in restored.listed if not (root / rel).exists()]
            restored.kept_local = len(restored.listed) - len(wanted)
            files = {rel: _folder_files(manifest, members, rel) for rel in wanted}
            _check_placed(files, members)
            restored.stores = list(manifest["stores"])
            for name in restored.stores:
                restored.readings += _restore_store(tar, members, name, stores_folder / name, Path(scratch))
            contents = _read_contents(tar, members, files, Path(scratch))  # all checked before any is placed
            for rel in wanted:
                if _place_folder(files[rel], contents, root / rel, Path(scratch)):
                    restored.folders.append(rel)
                else:  # nested in a folder placed just before
                    restored.kept_local += 1
    except UNREADABLE as error:
        raise ArchiveError(f"{path}: not a readable archive ({type(error).__name__}: {error})") from None
    except ArchiveError as error:
        raise ArchiveError(str(error) if str(error).startswith(str(path)) else f"{path}: {error}") from None
    if relog:
        _sync(root, restored.folders, restored, tracking_uri)
    return restored


# ---- a view: any host's archive, for its tables --------------------------------------------------------
@dataclass
class View:
    """A named archive restored apart from everything of this host's: its own campaign folders, stores
    and MLflow database under one folder, for tables only (nothing there is measured or packed)."""
    archive: Path
    host: dict
    root: Path
    stores: Path
    tracking_uri: str
    restored: Restored

    def store(self, name: str) -> Path:
        """The view's copy of the campaign's store `name` (a file name), which the archive must hold."""
        path = self.stores / Path(name).name
        if not path.is_file():
            held = sorted(p.name for p in self.stores.glob("*.sqlite")) or ["none"]
            raise ArchiveError(f"{self.archive}: holds no store {Path(name).name!r} (it holds {', '.join(held)})")
        return path


def is_archive_file(path: Path | None) -> bool:
    """Whether --archive names one host's archive (FOLDER/<host key>.tar.xz) rather than the folder."""
    return path is not None and path.name.endswith(tuple(SUFFIX.values()))


def open_view(path: Path, views: Path | None = None) -> View:
    """The archive at `path`, of whichever host made it, restored into views/<its folder>/<host key>/
    (views: the outputs folder's archive-views/): the campaign's folders under runs/, its stores under
    stores/, its runs in mlflow.db there. Opened again, only what is missing is added, and a run not yet
    re-logged is tried again; a changed archive file starts the view afresh. The archive's name must be
    its own host's key, so a renamed file cannot pass one host's readings off as another's."""
    if not path.is_file():
        raise ArchiveError(f"{path}: no such archive")
    try:
        with tarfile.open(path, "r:*") as tar:
            _members(tar, path)  # over a cap: refused before the views folder is touched
            host = _read_manifest(tar, path).get("host")
    except UNREADABLE as error:
        raise ArchiveError(f"{path}: not a readable archive ({type(error).__name__})") from None
    if not (isinstance(host, dict) and isinstance(host.get("cpu_model"), str) and isinstance(host.get("cores"), int)
            and isinstance(host.get("flags"), str)):
        raise ArchiveError(f"{path}: {MANIFEST} names no host")
    key = host_key(host)
    if path.name not in {f"{key}{suffix}" for suffix in SUFFIX.values()}:
        raise ArchiveError(f"{path}: its manifest's host is {key}, not the host its name says")
    views = views or _default_views()
    base = views / path.parent.resolve().name / key
    digest, mark = _sha256(path), base / "archive.sha256"
    if mark.is_file() and mark.read_text().strip() != digest:
        shutil.rmtree(base)  # a view is derived: a newer archive is read again whole
    view = View(path, host, base / "runs", base / "stores", f"sqlite:///{(base / 'mlflow.db').resolve()}", Restored())
    try:
        view.stores.mkdir(parents=True, exist_ok=True)
        mark.write_text(digest + "\n")
        view.restored = _restore_file(path, view.root, view.stores, view.tracking_uri, host, relog=False)
    except BaseException:
        _remove_view(base, views)
        raise
    _relog_view(base, view)
    return view


def _remove_view(base: Path, views: Path) -> None:
    """A view that could not be read whole, removed, and the folders above it when that empties them."""
    shutil.rmtree(base, ignore_errors=True)
    for folder in (base.parent, views):
        try:
            folder.rmdir()
        except OSError:
            return  # another view lives there


def _default_views() -> Path:
    from tuning.config.storage import outputs_dir

    return Path(outputs_dir()) / "archive-views"


def _relog_view(base: Path, view: View) -> None:
    """Every run of the view not yet in its MLflow store, re-logged; those done are listed in relogged.txt."""
    done_file = base / "relogged.txt"
    done = set(done_file.read_text().split()) if done_file.is_file() else set()
    runs = [rel for rel in view.restored.listed if (view.root / rel / "config.yaml").is_file()]
    done |= set(_sync(view.root, [rel for rel in runs if rel not in done], view.restored, view.tracking_uri))
    done_file.write_text("".join(f"{rel}\n" for rel in runs if rel in done))


def _members(tar: tarfile.TarFile, path: Path) -> dict[str, tarfile.TarInfo]:
    """The archive's members by name (of two of one name, the last), read one header at a time: the
    scan stops at the first member past MAX_FILES or MAX_ARCHIVE_BYTES, before any data is read."""
    members, count, total = {}, 0, 0
    for member in tar:
        count, total = count + 1, total + member.size
        if count > MAX_FILES:
            raise ArchiveError(f"{path}: more than {MAX_FILES:,} members (MAX_FILES)")
        if total > MAX_ARCHIVE_BYTES:
            raise ArchiveError(f"{path}: its members unpack to over {MAX_ARCHIVE_BYTES >> 20} MiB (MAX_ARCHIVE_BYTES)")
        members[member.name] = member
    return members


def _check_placed(files: dict, members: dict) -> None:
    """The folders' files are refused when they would be over MAX_FILES or MAX_RESTORED_BYTES once
    put in place: one blob is extracted once but copied to every file that names it."""
    placed = [name for entries in files.values() for _, name, _ in entries]
    if len(placed) > MAX_FILES:
        raise ArchiveError(f"its folders would hold more than {MAX_FILES:,} files (MAX_FILES)")
    if sum(members[name].size for name in placed) > MAX_RESTORED_BYTES:
        raise ArchiveError(f"its folders would hold over {MAX_RESTORED_BYTES >> 20} MiB (MAX_RESTORED_BYTES)")


def _read_manifest(tar: tarfile.TarFile, path: Path) -> dict:
    try:
        member = tar.getmember(MANIFEST)
        if not member.isfile() or member.size > MAX_FILE_BYTES:
            raise ValueError(f"not a file of at most {MAX_FILE_BYTES >> 20} MiB")
        manifest = json.loads(tar.extractfile(member).read())
    except (KeyError, AttributeError, ValueError, RecursionError) as error:
        raise ArchiveError(f"{path}: no readable {MANIFEST} ({type(error).__name__})") from None
    if not isinstance(manifest, dict):
        raise ArchiveError(f"{path}: {MANIFEST} is not an object")
    return manifest


def _manifest(tar: tarfile.TarFile, path: Path, identity: dict) -> dict:
    manifest = _read_manifest(tar, path)
    if type(manifest.get("format")) is not int or manifest["format"] not in READABLE:
        raise ArchiveError(f"{path}: {MANIFEST} is not of a known format ({', '.join(map(str, sorted(READABLE)))})")
    if manifest.get("host") != identity:
        raise ArchiveError(f"{path}: made on another host ({manifest.get('host')}), this is {identity}")
    for key in ("folders", "stores"):
        entries = manifest.get(key)
        if not isinstance(entries, list) or not all(isinstance(e, str) and _safe(e) for e in entries):
            raise ArchiveError(f"{path}: {MANIFEST} {key} must be relative paths inside the campaign")
    if any("/" in name for name in manifest["stores"]):
        raise ArchiveError(f"{path}: {MANIFEST} stores must be file names")
    if manifest["format"] >= 2 and not _valid_files(manifest.get("files"), manifest["folders"]):
        raise ArchiveError(f"{path}: {MANIFEST} files must map each folder's relative file names to sha256 digests")
    return manifest


def _valid_files(files, folders: list[str]) -> bool:
    return (isinstance(files, dict) and set(files) == set(folders)
            and all(isinstance(inner, dict) for inner in files.values())
            and all(isinstance(name, str) and _safe(name) and isinstance(digest, str)
                    and re.fullmatch(r"[0-9a-f]{64}", digest) for inner in files.values()
                    for name, digest in inner.items()))


def _safe(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return bool(parts) and not PurePosixPath(name).is_absolute() and ".." not in parts and "\\" not in name


def _restore_store(tar, members: dict, name: str, local: Path, scratch: Path) -> int:
    from tuning.store import StoreError, copy_store, open_store

    member = members.get(f"stores/{name}")
    if member is None or not member.isfile() or member.size > MAX_FILE_BYTES:
        raise ArchiveError(f"stores/{name}: missing, not a file, or over {MAX_FILE_BYTES >> 20} MiB")
    copy = scratch / f"restored-{name}"
    with tar.extractfile(member) as packed, open(copy, "wb") as out:
        shutil.copyfileobj(packed, out)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        source = open_store(copy, f"stores/{name}", read_only=True)
    except StoreError as error:
        raise ArchiveError(f"{error} (in the archive)") from None
    try:
        target = open_store(local, "--stores")
    except StoreError as error:
        source.close()
        raise ArchiveError(f"stores/{name}: this machine's copy {local}: {error}") from None
    except BaseException:
        source.close()
        raise
    try:
        return copy_store(source, target).copied
    except StoreError as error:
        raise ArchiveError(f"stores/{name}: {error}") from None
    finally:
        source.close()
        target.close()


def _folder_files(manifest: dict, members: dict, rel: str) -> list[tuple[str, str, str | None]]:
    """The folder's files as (file name, member name, content hash or None), each member checked."""
    if manifest["format"] == 1:
        prefix = f"runs/{rel}/"
        entries = [(name[len(prefix):], name, None) for name in members if name.startswith(prefix)]
    else:
        entries = [(inner, f"blobs/{digest}", digest) for inner, digest in manifest["files"][rel].items()]
    for inner, name, _ in entries:
        member = members.get(name)
        if not (member is not None and member.isfile() and _safe(inner) and member.size <= MAX_FILE_BYTES):
            raise ArchiveError(f"{name} ({inner}): missing, not a plain file inside its folder, "
                               f"or over {MAX_FILE_BYTES >> 20} MiB")
    return entries


def _read_contents(tar, members: dict, files: dict, scratch: Path) -> dict[str, Path]:
    """The members the folders need, read in the archive's order (a compressed archive is read
    once, not once a backward seek) into scratch files, each blob checked against its hash."""
    needed = {name: digest for entries in files.values() for _, name, digest in entries}
    contents, folder = {}, scratch / "contents"
    folder.mkdir()
    for member in tar.getmembers():
        if member.name not in needed or members[member.name] is not member:
            continue  # of two members of one name, the one _folder_files checked
        out = folder / str(len(contents))
        with tar.extractfile(member) as source, open(out, "wb") as target:
            shutil.copyfileobj(source, target)
        if needed[member.name] is not None and _sha256(out) != needed[member.name]:
            raise ArchiveError(f"{member.name}: its content does not match its hash")
        contents[member.name] = out
    return contents


def _place_folder(entries: list, contents: dict, local: Path, scratch: Path) -> bool:
    """The folder built in scratch, then moved into place whole; False if one is there already."""
    if local.exists():
        return False
    staged = scratch / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    for inner, name, _ in entries:
        out = staged / inner
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(contents[name], out)
    local.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(staged, local)
    return True


def _sync(root: Path, folders: list[str], restored: Restored, tracking_uri: str | None) -> list[str]:
    """Each of the restored runs (a folder with records) logged again to this machine's MLflow store;
    returns those re-logged."""
    from tuning.tools.sync import sync

    relogged = []
    for rel in folders:
        folder = root / rel
        if not (folder / "config.yaml").is_file():
            continue  # a step's folder
        try:
            sync(folder, tracking_uri)
            restored.synced += 1
            relogged.append(rel)
        except Exception as error:  # noqa: BLE001 - the folder is back either way; `tuning.tools.sync` retries
            restored.problems.append(f"{rel}: not re-logged to MLflow ({type(error).__name__}: {error})")
    return relogged


# ---- the experiments' option ---------------------------------------------------------------------------
def add_archive_option(parser, name: str) -> None:
    parser.add_argument("--archive", type=Path, metavar="FOLDER",
                        help=f"carry the campaign between machines: first restore this host's archive from FOLDER, "
                             f"after the call pack it there again, for a commit (e.g. campaigns/{name}; "
                             "docs/claims.md §Carrying a campaign between machines); with --table-only, FOLDER/<host "
                             "key>.tar.xz reads that host's archive, of any host, apart from this one's, for its tables")


def view_for_tables(archive: Path | None, table_only: bool, views: Path | None = None,
                    stores: tuple = ()) -> View | None:
    """`--archive FILE`: the view of that archive for the tables (None for `--archive FOLDER` or none),
    holding each of `stores` (the campaign's store paths; the view's copies are `view.store(name)`).
    Anything else than `--table-only` with a file is refused: a campaign continues only from its folder,
    on a host of the archive's kind, so another CPU's readings never enter its stores."""
    if not is_archive_file(archive):
        return None
    if not table_only:
        raise SystemExit(f"tunelab: --archive {archive}: one host's archive is read for its tables only (add "
                         f"--table-only); a campaign continues from its folder (--archive {archive.parent}) on a host "
                         "whose key is the archive's name")
    try:
        view = open_view(archive, views)
        for name in stores:
            view.store(name)
    except ArchiveError as error:
        raise SystemExit(f"tunelab: --archive: {error}") from None
    print(f"archive {archive} (host {host_key(view.host)}), read into {view.root.parent}: {view.restored.summary()}")
    if view.restored.problems:  # a table of part of the runs would read as the whole campaign's
        raise SystemExit(f"tunelab: --archive {archive}: {len(view.restored.problems)} run(s) not re-logged into "
                         f"the view (above); no table from part of the campaign (the same command tries them again)")
    return view


def archived(folder: Path | None, jobs: list[Job], root: Path, stores, tracking_uri: str | None, work, pack_after=True):
    """`work()` between a restore and a pack of `folder` (nothing of either without a folder); the pack
    happens however the work ends, so a campaign stopped by a failed run keeps what it finished."""
    if folder is None:
        return work()
    if is_archive_file(folder):
        raise ArchiveError(f"{folder}: a named archive is read by view_for_tables, not continued")
    if len({Path(s).parent for s in stores}) > 1:
        raise ArchiveError("stores: an archived campaign keeps its stores in one folder")
    identity, note = campaign_identity(folder)  # read once: the restore, the message and the pack name one host
    if note:
        print(f"archive: {note}")
    try:
        restored = restore(root, Path(stores[0]).parent if stores else root, folder, tracking_uri, identity)
    except ArchiveError as error:
        raise SystemExit(f"tunelab: --archive: {error}") from None
    print(f"archive {_existing_archive(folder, identity) or archive_path(folder, identity)}: "
          + (restored.summary() if restored else "none for this host yet"))
    try:
        return work()
    finally:
        if pack_after:
            kept = restored.listed if restored else []
            print(f"archive: packed {pack(jobs, root, [Path(s) for s in stores], folder, identity, kept)}")


# ---- forgetting finished work ------------------------------------------------------------------------
def forget(folder: Path, names: list[str], campaign: Path, tracking_uri: str | None) -> list[str]:
    """This host's kind's archive in `folder` packed again without the run folders `names` (as the
    archive names them, relative to the campaign), and their folders under `campaign` here removed
    with their MLflow runs, so the next call of the campaign runs them again (a finished folder left
    here would be packed again). The stores keep every reading: a forgotten run made again is
    answered from the store wherever it proposes a config already read. Returns what was done."""
    identity, _ = campaign_identity(folder)
    path = _existing_archive(folder, identity)
    if path is None:
        raise ArchiveError(f"{folder}: no archive of this host's kind ({host_key(identity)}) to forget runs in")
    with tempfile.TemporaryDirectory() as scratch:  # the archive read into scratch: nothing here changes yet
        root, stores = Path(scratch) / "runs", Path(scratch) / "stores"
        restored = _restore_file(path, root, stores, None, identity, relog=False)
        unknown = [name for name in names if name not in restored.listed]
        if unknown:
            raise ArchiveError(f"{path}: holds no folder {', '.join(map(repr, unknown))} (it holds "
                               f"{len(restored.listed)}, such as {restored.listed[:1]})")
        kept = [rel for rel in restored.listed if rel not in names]
        pack([], root, [stores / name for name in restored.stores], folder, identity, kept)
    done = [f"{path}: packed again without {', '.join(names)} ({len(kept)} folders kept, every store reading kept)"]
    for name in names:
        local = campaign / name
        if local.is_dir():
            deleted = _delete_mlflow_runs(local, tracking_uri)
            shutil.rmtree(local)
            done.append(f"{local}: removed, with {deleted} MLflow run(s)")
    return done


def _delete_mlflow_runs(local: Path, tracking_uri: str | None) -> int:
    """The MLflow runs of a run folder: the one its mlflow_run_id names, and copies a restore made of it."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from tuning.tools.sync import COPY_TAG

    run_id_file = local / "mlflow_run_id"
    known = run_id_file.read_text().strip() if run_id_file.is_file() else ""
    if not re.fullmatch(r"[0-9a-f]{32}", known):  # untrusted: only a run id goes into a filter
        return 0
    client = MlflowClient(tracking_uri=tracking_uri)
    runs = set()
    try:
        runs.add(client.get_run(known).info.run_id)
    except MlflowException:
        pass  # made on another machine: only its copies are here
    experiments = [e.experiment_id for e in client.search_experiments()]
    if experiments:
        runs |= {run.info.run_id for run in client.search_runs(experiments, f"tags.`{COPY_TAG}` = '{known}'")}
    for run in runs:
        client.delete_run(run)
    return len(runs)


def build_parser(prog: str | None = None):
    from tuning.config.cli import add_command, add_tracking_uri, new_parser

    parser = new_parser("python -m tuning.tools.campaign_archive", "A campaign's archive: forget finished runs.", prog)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="forget (see its --help)")
    forget_cmd = add_command(commands, "forget", help="pack this host's archive again without some runs and remove their "
                                                      "folders and MLflow runs here, so the next call makes them again")
    forget_cmd.add_argument("archive", type=Path, metavar="FOLDER",
                            help="the campaign's archive folder, e.g. campaigns/gemm-tiling (this host's archive in it)")
    forget_cmd.add_argument("runs", nargs="+", metavar="RUN", help="run folders as the archive names them, e.g. "
                                                                   "gemm_2048/xgb/seed0")
    forget_cmd.add_argument("--campaign", type=Path, required=True,
                            help="the campaign's run folders here, e.g. outputs/campaigns/gemm-tiling")
    add_tracking_uri(forget_cmd, help="the MLflow store whose runs of them are deleted")
    return parser


def main(argv=None, prog: str | None = None) -> None:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if is_archive_file(args.archive):
        parser.error(f"FOLDER: {args.archive} is an archive file; name its folder (this host's archive in it is used)")
    try:
        print("\n".join(forget(args.archive, args.runs, args.campaign, args.tracking_uri)))
    except ArchiveError as error:
        raise SystemExit(f"tunelab: {error}") from None


if __name__ == "__main__":
    main()
