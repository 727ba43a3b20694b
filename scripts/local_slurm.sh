#!/usr/bin/env bash
# A real SLURM cluster on this machine, for the project's tests and CI: one node (this host), or two
# simulated nodes (GTE_SLURM_NODES=2) for multi-node jobs.
#
#   bash scripts/local_slurm.sh start    install (once), configure, start, wait until the nodes are idle
#   bash scripts/local_slurm.sh stop     cancel queued jobs, stop the daemons this script started
#   bash scripts/local_slurm.sh status   print the daemons, nodes and sinfo/squeue; exit 0 only if the cluster answers
#
# Two nodes: Debian's slurm-wlm has no --enable-multiple-slurmd, so each slurmd runs in its own UTS
# namespace (unshare --uts) whose hostname is its NodeName (gte-node1, gte-node2), with its own spool,
# log and pid files (%n in slurm.conf), port and loopback address (127.0.0.2, 127.0.0.3: names resolve
# through marked lines in /etc/hosts, removed by `stop`). Job steps inherit the namespace, so each rank
# sees its node's hostname, as on a real cluster. Munge, MariaDB, slurmdbd and slurmctld stay on the
# host. Switching between one and two nodes restarts the daemons.
#
# Runs as root on Debian 12 (SLURM 22.05) without systemd and without writable cgroups, so every
# daemon is started by hand, in the foreground of its own session (setsid), with its PID recorded
# under $GTE_SLURM_DIR/pid. `stop` kills only those PIDs, never anything by name.
#
# Accounting (slurmdbd + a private MariaDB) is on because submitit needs it: without it, the
# result of a cancelled job is never known and job.result() waits forever.
#
# Settings (environment):
#   GTE_SLURM_DIR      state, spool, logs, pids, database   [/var/lib/gte-pro-slurm]
#   GTE_SLURM_TIMEOUT  seconds `start` waits for an idle node [90]
#   GTE_SLURM_DB_PORT  TCP port of the private MariaDB, on 127.0.0.1 only [3307]
#   GTE_SLURM_NODES    1 (this host is the node) or 2 (gte-node1 and gte-node2)   [1]
set -euo pipefail

BASE=${GTE_SLURM_DIR:-/var/lib/gte-pro-slurm}
TIMEOUT=${GTE_SLURM_TIMEOUT:-90}
DB_PORT=${GTE_SLURM_DB_PORT:-3307}
NODES=${GTE_SLURM_NODES:-1}
[[ $NODES == 1 || $NODES == 2 ]] || { echo "[local_slurm] ERROR: GTE_SLURM_NODES must be 1 or 2, not '$NODES'" >&2; exit 2; }
HOSTS_MARK="# gte-pro local_slurm node"
CLUSTER=gtepro
PARTITION=debug
PID_DIR=$BASE/pid
LOG_DIR=$BASE/log
RUN_DIR=$BASE/run
DB_DIR=$BASE/mysql
DB_SOCK=$RUN_DIR/mysql/mysqld.sock   # in a folder the mysql user may write
CONF_DIR=/etc/slurm            # the clients (sbatch, sinfo, submitit) read slurm.conf from here
MARK="# Written by gte-pro scripts/local_slurm.sh; rewritten on every start."

say() { echo "[local_slurm] $*"; }
die() { echo "[local_slurm] ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- install
install_packages() {
    local missing=()
    for bin in slurmctld slurmd slurmdbd sinfo sacctmgr munged mariadbd mariadb-install-db; do
        command -v "$bin" >/dev/null 2>&1 || [[ -x /usr/sbin/$bin ]] || missing+=("$bin")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    say "installing SLURM, munge and MariaDB (missing: ${missing[*]})"
    apt-get update -q >"${TMPDIR:-/tmp}/local_slurm_apt.log" 2>&1 \
        || { tail -n 20 "${TMPDIR:-/tmp}/local_slurm_apt.log" >&2; die "apt-get update failed"; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        slurmctld slurmd slurm-client munge slurmdbd mariadb-server \
        >>"${TMPDIR:-/tmp}/local_slurm_apt.log" 2>&1 \
        || { tail -n 20 "${TMPDIR:-/tmp}/local_slurm_apt.log" >&2; die "apt-get install failed"; }
}

# ---------------------------------------------------------------- daemon bookkeeping
# The command name the kernel reports for each daemon: a recorded PID only counts as ours while
# it still runs that program (PIDs get reused after a reboot or a kill -9).
declare -A COMM=([munged]=munged [mariadbd]=mariadbd [slurmdbd]=slurmdbd
                 [slurmctld]=slurmctld [slurmd]=slurmd)

pid_of() {  # prints the recorded PID of daemon $1 (slurmd-NODE: a simulated node's) if alive and that daemon
    local f=$PID_DIR/$1.pid pid
    [[ -r $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "${COMM[${1%%-*}]}" ]] || return 1
    echo "$pid"
}

launch() {  # launch NAME CMD...: run CMD in its own session, in the foreground, log to LOG_DIR
    local name=$1; shift
    # setsid: not killed with the caller's process group; </dev/null and log redirection: the
    # caller's pipes (e.g. a test capturing our output) are not held open by the daemon.
    # 9>&-: the daemon must not inherit (and so keep) the start/stop lock.
    setsid "$@" </dev/null >>"$LOG_DIR/$name.out" 2>&1 9>&- &
    echo $! >"$PID_DIR/$name.pid"
}

alive() {  # PID $1 runs; a zombie counts as gone (PID 1 here may take seconds to reap daemons)
    local state
    state=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [[ $state != Z ]]
}

wait_for() {  # wait_for SECONDS DAEMON CMD...: retry CMD every 0.5 s until it succeeds
    local secs=$1 what=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        # Fail fast when the daemon we launched has already exited.
        # (Only "alive" is checked: right after launch the PID may still be setsid/setpriv.)
        if [[ -f $PID_DIR/$what.pid ]] && ! alive "$(<"$PID_DIR/$what.pid")"; then
            show_logs; die "$what exited during start-up"
        fi
        ((SECONDS < end)) || { show_logs; die "$what not ready after ${secs}s"; }
        sleep 0.5
    done
}

show_logs() {
    # SLURM daemons write NAME.log; NAME.out (their stderr) matters when they die before opening it.
    local d f
    for d in munged mariadbd slurmdbd slurmctld slurmd $(slurmd_daemons); do
        f=$LOG_DIR/$d.log
        [[ -s $f ]] || f=$LOG_DIR/$d.out
        [[ -s $f ]] || continue
        echo "----- tail of $f" >&2
        tail -n 15 "$f" >&2
    done
}

# ---------------------------------------------------------------- configuration
host_name() { hostname -s; }   # slurmctld matches SlurmctldHost by this name
# The nodes: this host (slurmd and slurmctld match their config by its name), or the simulated two.
node_names() { if [[ $NODES == 2 ]]; then echo gte-node1 gte-node2; else host_name; fi; }
node_addr() { case $1 in gte-node1) echo 127.0.0.2 ;; gte-node2) echo 127.0.0.3 ;; *) echo 127.0.0.1 ;; esac; }
node_port() { case $1 in gte-node1) echo 6821 ;; gte-node2) echo 6822 ;; *) echo 6818 ;; esac; }
# the pid-file names of the slurmd daemons: slurmd (one node) or slurmd-gte-node1, slurmd-gte-node2
slurmd_daemons() { if [[ $NODES == 2 ]]; then echo slurmd-gte-node1 slurmd-gte-node2; else echo slurmd; fi; }

write_slurm_conf() {
    local node hw cpus mem node_lines=""
    # The node as slurmd measures it ("CPUs=2 Boards=1 ... RealMemory=24105"): a larger
    # RealMemory or CPU count than measured would drain the node.
    hw=$(slurmd -C | head -n1 | sed 's/^NodeName=[^ ]* //')
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    [[ -n $mem ]] || die "could not read RealMemory from 'slurmd -C': $hw"
    if [[ $hw == "CPUs=$(nproc) "* ]]; then
        cpus=${hw%% RealMemory=*}          # CPUs with the socket/core/thread layout
    else
        cpus="CPUs=$(nproc)"               # fewer CPUs usable than present (affinity, quota)
    fi

    for node in $(node_names); do
        node_lines+="NodeName=$node NodeAddr=$(node_addr "$node") Port=$(node_port "$node") $cpus RealMemory=$mem State=UNKNOWN"$'\n'
    done
    if [[ -f $CONF_DIR/slurm.conf ]] && ! grep -qF "$MARK" "$CONF_DIR/slurm.conf"; then
        say "keeping a copy of a foreign $CONF_DIR/slurm.conf as slurm.conf.bak"
        cp -p "$CONF_DIR/slurm.conf" "$CONF_DIR/slurm.conf.bak"
    fi
    cat >"$CONF_DIR/slurm.conf.tmp" <<EOF
$MARK
ClusterName=$CLUSTER
# The name must be this machine's short hostname (slurmctld refuses to run otherwise);
# the address is loopback so nothing depends on DNS or /etc/hosts.
SlurmctldHost=$(host_name)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again only after the credential lifetime (default 120 s).
AuthInfo=cred_expire=10
MpiDefault=none
MailProg=/bin/true
# No cgroups here: track processes through /proc, bind no tasks.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Short loops so pending jobs (e.g. requeued ones whose begin time passed) start within seconds.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobRequeue=1
# A DOWN node comes back as soon as its slurmd registers again.
ReturnToService=2
SlurmctldTimeout=20
SlurmdTimeout=30
MessageTimeout=10
KillWait=10
InactiveLimit=0
StateSaveLocation=$BASE/state/slurmctld
# %n: the node's name, so that two slurmd on one machine keep apart
SlurmdSpoolDir=$BASE/state/slurmd-%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$node_lines# FORCE:2 = each CPU may hold two jobs, so a 2-task job can run beside another job on 2 CPUs.
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
EOF
    mv "$CONF_DIR/slurm.conf.tmp" "$CONF_DIR/slurm.conf"
    chmod 644 "$CONF_DIR/slurm.conf"
}

write_slurmdbd_conf() {
    # slurmdbd refuses a config that others can read (it holds the DB password).
    local pass
    pass=$(<"$BASE/db.pass")
    install -m 600 -o root -g root /dev/null "$CONF_DIR/slurmdbd.conf"
    cat >"$CONF_DIR/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
DebugLevel=info
EOF
}

# ---------------------------------------------------------------- the daemons, in start order
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munged() {
    if pid_of munged >/dev/null; then return 0; fi
    if munge_ok; then   # e.g. started by the package's init script: use it, but it is not ours
        say "munged: already running (not started by this script), using it"
        return 0
    fi
    # The key is made by the munge package; make one if it is gone. munged insists on these owners/modes.
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "munged: creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
            || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
    say "munged: starting"
    launch munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground
    wait_for 15 munged munge_ok
}

db_root() { mariadb --no-defaults --protocol=socket --socket="$DB_SOCK" -uroot "$@"; }

start_mariadb() {
    # A private instance (own datadir, socket and port) rather than the system's `service
    # mariadb`: it needs no init system, and its PID is ours to stop.
    if [[ ! -d $DB_DIR/mysql ]]; then
        say "mariadb: initialising $DB_DIR"
        install -d -o mysql -g mysql -m 750 "$DB_DIR"
        mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$LOG_DIR/mariadb-install.out" 2>&1 \
            || { tail -n 20 "$LOG_DIR/mariadb-install.out" >&2; die "mariadb-install-db failed"; }
    fi
    if ! pid_of mariadbd >/dev/null; then
        say "mariadb: starting on 127.0.0.1:$DB_PORT"
        chown mysql:mysql "$RUN_DIR/mysql"
        launch mariadbd /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" \
            --socket="$DB_SOCK" --pid-file="$RUN_DIR/mysql/mariadbd.pid" \
            --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
            --innodb-lock-wait-timeout=900
        wait_for 60 mariadbd db_root -e 'SELECT 1'
    fi
    # The accounting database and its user (idempotent). The password is made once and kept.
    if [[ ! -s $BASE/db.pass ]]; then
        (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$BASE/db.pass")
    fi
    local pass
    pass=$(<"$BASE/db.pass")
    db_root -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

start_slurmdbd() {
    if ! pid_of slurmdbd >/dev/null; then
        say "slurmdbd: starting"
        launch slurmdbd /usr/sbin/slurmdbd -D
    fi
    wait_for 60 slurmdbd sacctmgr -n show cluster
    # Register the cluster before slurmctld first connects. Associations are not enforced,
    # so no account or user is needed for jobs to run (root gets one with the cluster anyway).
    if [[ -z "$(sacctmgr -n -P show cluster "$CLUSTER" format=cluster 2>/dev/null)" ]]; then
        say "slurmdbd: registering cluster $CLUSTER"
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

start_slurmctld() {
    if ! pid_of slurmctld >/dev/null; then
        say "slurmctld: starting"
        launch slurmctld /usr/sbin/slurmctld -D
    fi
    wait_for 60 slurmctld scontrol ping
}

start_slurmd() {
    if [[ $NODES == 1 ]]; then
        pid_of slurmd >/dev/null && return 0
        say "slurmd: starting as node $(host_name)"
        install -d -m 755 "$BASE/state/slurmd-$(host_name)"
        launch slurmd /usr/sbin/slurmd -D -N "$(host_name)"
        return 0
    fi
    local node
    for node in $(node_names); do
        pid_of "slurmd-$node" >/dev/null && continue
        say "slurmd: starting node $node (own UTS namespace, $(node_addr "$node"):$(node_port "$node"))"
        install -d -m 755 "$BASE/state/slurmd-$node"
        # unshare and sh exec into slurmd: the recorded PID is slurmd's, its namespace dies with it
        launch "slurmd-$node" unshare --uts sh -c "hostname $node && exec /usr/sbin/slurmd -D -N $node"
    done
}

write_hosts() {  # the simulated nodes' names resolve to their own loopback addresses (rank 0's is MASTER_ADDR)
    remove_hosts
    [[ $NODES == 2 ]] || return 0
    local node
    for node in $(node_names); do echo "$(node_addr "$node") $node $HOSTS_MARK"; done >>/etc/hosts
}

remove_hosts() {  # rewritten in place: /etc/hosts may be a bind mount that cannot be replaced by a rename
    grep -q "$HOSTS_MARK" /etc/hosts 2>/dev/null || return 0
    local kept
    kept=$(grep -v "$HOSTS_MARK" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
}

# one line per node: "NAME STATE"
node_states() { timeout 15 sinfo -h -N -o '%N %T' 2>/dev/null; }
node_state() {  # the worst state of the configured nodes: a node that takes work reads as such only if all do
    local states node state
    states=$(node_states) || return 1
    for node in $(node_names); do
        state=$(awk -v n="$node" '$1 == n {print $2; exit}' <<<"$states")
        [[ $state =~ ^(idle|mixed|allocated|completing)$ ]] || { echo "${state:-unknown} ($node)"; return 0; }
    done
    echo idle
}

wait_node_idle() {
    # idle, or busy with jobs that survived a restart: either way the node takes work.
    local end=$((SECONDS + TIMEOUT)) state next_resume=$((SECONDS + 2))
    while :; do
        state=$(node_state || true)
        case $state in
            idle) say "node(s) $(node_names) take work"; return 0 ;;
            # A drain or down kept in the saved state from an earlier run (e.g. "Kill task
            # failed"): put the node back in service. Retried, since slurmctld rejects it until
            # slurmd has registered.
            *drain*|down*|fail*)
                if ((SECONDS >= next_resume)); then
                    say "node is $state ($(timeout 15 sinfo -h -o %E | head -n1)), resuming"
                    scontrol update nodename="$(node_names | tr ' ' ',')" state=resume 2>/dev/null || true
                    next_resume=$((SECONDS + 5))
                fi ;;
        esac
        if ((SECONDS >= end)); then
            timeout 15 sinfo -R >&2 || true
            show_logs
            die "node not idle after ${TIMEOUT}s (state: '${state:-no answer}')"
        fi
        sleep 1
    done
}

healthy() {
    local d
    for d in slurmdbd slurmctld $(slurmd_daemons); do pid_of "$d" >/dev/null || return 1; done
    [[ "$(cat "$BASE/nodes" 2>/dev/null)" == "$(node_names)" ]] && munge_ok && [[ "$(node_state)" == idle ]]
}

# ---------------------------------------------------------------- commands
cmd_start() {
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    install_packages
    if [[ -d $PID_DIR ]] && healthy; then
        say "already running"
        timeout 15 sinfo || true
        return 0
    fi
    if [[ -s $BASE/nodes && "$(<"$BASE/nodes")" != "$(node_names)" ]]; then
        say "restarting: the nodes were $(<"$BASE/nodes"), now $(node_names)"
        cmd_stop
    fi
    local t0=$SECONDS
    install -d -m 755 "$CONF_DIR" "$BASE" "$PID_DIR" "$LOG_DIR" "$RUN_DIR" "$BASE/state/slurmctld" "$BASE/state/slurmd"
    install -d -o mysql -g mysql -m 755 "$RUN_DIR/mysql"
    start_munged
    start_mariadb
    write_slurmdbd_conf
    write_slurm_conf    # before slurmdbd: sacctmgr finds slurmdbd through slurm.conf
    node_names >"$BASE/nodes"
    write_hosts
    start_slurmdbd
    start_slurmctld
    start_slurmd
    wait_node_idle
    say "ready in $((SECONDS - t0))s (logs: $LOG_DIR)"
}

cmd_stop() {
    # Jobs left running would outlive slurmd (their slurmstepd keeps going): cancel them
    # through SLURM while the controller still answers.
    if pid_of slurmctld >/dev/null && [[ -n "$(timeout 15 squeue -h -o %i 2>/dev/null)" ]]; then
        say "cancelling queued and running jobs"
        timeout 15 squeue -h -o %A | xargs -r scancel || true
        local end=$((SECONDS + 20))
        while [[ -n "$(timeout 15 squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < end)); do sleep 1; done
    fi
    # Reverse start order, and only the PIDs this script recorded.
    local d pid end f
    local slurmds=()
    for f in "$PID_DIR"/slurmd.pid "$PID_DIR"/slurmd-*.pid; do [[ -e $f ]] && slurmds+=("$(basename "$f" .pid)"); done
    for d in "${slurmds[@]}" slurmctld slurmdbd mariadbd munged; do
        pid=$(pid_of "$d") || { rm -f "$PID_DIR/$d.pid"; continue; }
        say "stopping $d (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        end=$((SECONDS + 30))
        while alive "$pid" && ((SECONDS < end)); do sleep 0.2; done
        if alive "$pid"; then
            say "$d did not exit, killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$PID_DIR/$d.pid"
    done
    remove_hosts
    rm -f "$BASE/nodes"
    say "stopped"
}

cmd_status() {
    local d pid
    # the daemons of the cluster as it was started, whatever GTE_SLURM_NODES says now
    [[ -s $BASE/nodes ]] && NODES=$(wc -w <"$BASE/nodes")
    for d in munged mariadbd slurmdbd slurmctld $(slurmd_daemons); do
        if pid=$(pid_of "$d"); then echo "$d: running (pid $pid)"; else echo "$d: not running (from this script)"; fi
    done
    echo "nodes configured: $(cat "$BASE/nodes" 2>/dev/null || echo none)"
    grep "$HOSTS_MARK" /etc/hosts 2>/dev/null || true
    # what is left on the machine, ours or not: slurmd processes and UTS namespaces other than this shell's
    echo "slurmd processes (zombies not counted): $(ps -eo stat=,comm= | awk '$1 !~ /^Z/ && $2 == "slurmd"' | wc -l)"
    if command -v lsns >/dev/null 2>&1; then
        local own
        own=$(readlink /proc/$$/ns/uts | tr -dc 0-9)
        echo "other UTS namespaces: $(lsns -t uts -n -o NS 2>/dev/null | grep -vcx "$own" || true)"
    fi
    timeout 15 sinfo || { echo "cluster does not answer"; return 1; }
    timeout 15 squeue || return 1
}

lock() {  # one start/stop at a time (e.g. several test processes starting the cluster at once)
    exec 9>"$BASE.lock"
    flock -w 300 9 || die "another start/stop holds $BASE.lock"
}

case ${1:-} in
    start) lock; cmd_start ;;
    stop) lock; cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
