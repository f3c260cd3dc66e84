"""The store's side of a sync: a turn, a fact version or a tombstone as a record that travels
between devices (records), merged into this store (merge), and what this device has sent and
received (synclog). It sits above the tables and the forgetting it shares with the person's own
deletions; the folder exchange itself is mlxmem.sync, which reaches the store only through here.
"""
