/* The one definition of the snapshot (snapshot.h). */
#include "snapshot.h"

cc_snapshot_t cc_snapshot;
