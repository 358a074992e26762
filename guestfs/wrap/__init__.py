"""`guestfs run`, the wrapper: what it does before its app side loads (start.py), the
daemon it forks or executes (daemon_process.py), where it mounts (runspace.py), the app's
namespace, binds and privileges (run.py, apppriv.py), the OOM order (oomadj.py), and the
supervision that replaces a dead daemon (supervise.py)."""
