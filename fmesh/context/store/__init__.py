"""What a Context's ranks say to each other through the job's store, one protocol per module.

* :mod:`~fmesh.context.store.keys`: every key, spelled once; :mod:`~fmesh.context.store.records`: what is written
  under them (a rank's status, a meeting's verdict), as typed records.
* :mod:`~fmesh.context.store.wait`: the one blocking wait; :mod:`~fmesh.context.store.meeting`: the one meeting
  (compare with the first member, count in, block once on the verdict).
* :mod:`~fmesh.context.store.board`: the status board (what each rank is doing, which processes ended);
  :mod:`~fmesh.context.store.connections`: the sockets of a Context's groups (and of the store's clients), and how
  to cut them; :mod:`~fmesh.context.store.pulse`: each rank's heartbeat, which also watches that the store answers.
* The protocols: :mod:`~fmesh.context.store.rendezvous` (the start, whose watchers read the heartbeats of those who
  came: :mod:`~fmesh.context.store.arrivals`), :mod:`~fmesh.context.store.agreement` (a
  group's members agree on what they mean, with :mod:`~fmesh.context.store.diagnosis` when one does not come),
  :mod:`~fmesh.context.store.roll_call` (who survived a failed collective), :mod:`~fmesh.context.store.recovery_vote`
  (the survivors agree on the ranks lost).
* :mod:`~fmesh.context.store.hosting`: a store server this process hosts for others (the launcher's).

Each costs every member a constant number of store operations, whatever the number of members
(``tests/context/test_store_operations.py``, ``bench/scale.py``).
"""
