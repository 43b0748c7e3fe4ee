/*
 * hivefs_spank.c: SPANK plugin giving Slurm jobs a per-job HiveFS file system.
 *
 * Adds `--hivefs[=OPTS]` to sbatch, salloc and srun. OPTS is a comma-separated
 * list of items (see README.md next to this file):
 *
 *   chunk-size=SIZE       power of two, 4k..1g (4096, 512k, 1m, 1MiB)
 *   stripe=N              0 (all targets) .. 65536
 *   chooser=C             random | roundrobin | randomized-roundrobin | balanced
 *   meta-chooser=C        balanced | random | roundrobin
 *   meta=N                1 .. 4096 metadata servers
 *   cache-mode=M          native | paged
 *   atime=A               noatime | relatime | strictatime
 *   mirror                (no value)
 *   set=SERVICE.KEY=VAL   SERVICE is mgmtd, meta or storage; may be repeated
 *
 * Inside OPTS, `\,` stands for a comma and `\\` for a backslash (only values of
 * set= should ever need them); any other backslash is an error. The prolog
 * splits OPTS with the same rule.
 *
 * Where each callback does what:
 *
 *   - every context, slurm_spank_init: reads the plugstack.conf arguments
 *     (`mount=DIR`, default /mnt/hivefs) and registers the option.
 *   - the option callback (local, allocator and remote): validates OPTS; an
 *     invalid OPTS fails sbatch/salloc/srun at submission with a message.
 *   - allocator and local context (sbatch, salloc, srun that allocates),
 *     slurm_spank_init_post_opt: when --hivefs was given, puts OPTS into the job
 *     control environment as HIVEFS, which Slurm hands to the Prolog and
 *     Epilog as SPANK_HIVEFS (bare --hivefs gives SPANK_HIVEFS=default).
 *   - remote context (slurmstepd), slurm_spank_user_init: when --hivefs is in
 *     effect, sets HIVEFS_NAME=job<ID> and HIVEFS_MOUNT=<mount>/job<ID> in the
 *     job's environment, after checking that the mount point exists on the
 *     node (the prolog made it): a step of a job without a file system fails
 *     with a clear error instead of writing somewhere else.
 *
 * Jobs without --hivefs are untouched: no job control variable, no
 * environment, no file system.
 */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <slurm/spank.h>

SPANK_PLUGIN(hivefs, 1);

#define HIVEFS_OPTS_MAX 1024
#define HIVEFS_PATH_MAX 1024
/* The value given to the prolog for a bare --hivefs (no options). */
#define HIVEFS_DEFAULT_OPTS "default"

static int requested;                       /* --hivefs in effect */
static char opts[HIVEFS_OPTS_MAX + 1];      /* validated OPTS as given */
static char mount_base[HIVEFS_PATH_MAX + 1] = "/mnt/hivefs";

static int option_cb(int val, const char *optarg, int remote);

static struct spank_option hivefs_option = {
	"hivefs",
	"[OPTS]",
	"Give the job a HiveFS file system over its nodes' local disks. "
	"OPTS: comma-separated chunk-size=SIZE, stripe=N, chooser=C, "
	"meta-chooser=C, meta=N, cache-mode=native|paged, atime=A, mirror, "
	"set=SERVICE.KEY=VALUE (write \\, for a comma in a value). "
	"The job sees HIVEFS_MOUNT.",
	2, /* optional argument: --hivefs or --hivefs=OPTS */
	0,
	option_cb,
};

/* ---- validation ---------------------------------------------------------- */

static int is_one_of(const char *v, const char *const *set)
{
	for (; *set; set++)
		if (strcmp(v, *set) == 0)
			return 1;
	return 0;
}

static void list_of(const char *const *set, char *out, size_t len)
{
	out[0] = '\0';
	for (; *set; set++) {
		if (out[0])
			strncat(out, ", ", len - strlen(out) - 1);
		strncat(out, *set, len - strlen(out) - 1);
	}
}

/* A decimal integer in [min, max]; no sign, no spaces. */
static int parse_uint(const char *s, unsigned long min, unsigned long max,
		      unsigned long *out)
{
	unsigned long n = 0;

	if (!*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		n = n * 10 + (unsigned long) (*s - '0');
		if (n > max)
			return -1;
	}
	if (n < min)
		return -1;
	*out = n;
	return 0;
}

/*
 * A size as `hivefs` reads it: digits, an optional k/m/g/t (any case), an
 * optional trailing "b" or "ib". The chunk size must be a power of two from
 * 4 KiB to 1 GiB.
 */
static int valid_chunk_size(const char *s)
{
	char num[32];
	size_t len = strlen(s), i;
	uint64_t mul = 1, n = 0, v;

	if (len == 0 || len >= sizeof(num))
		return 0;
	memcpy(num, s, len + 1);
	for (i = 0; i < len; i++)
		if (num[i] >= 'A' && num[i] <= 'Z')
			num[i] = (char) (num[i] - 'A' + 'a');
	if (len >= 2 && strcmp(num + len - 2, "ib") == 0)
		num[len -= 2] = '\0';
	else if (len >= 1 && num[len - 1] == 'b')
		num[len -= 1] = '\0';
	if (len == 0)
		return 0;
	switch (num[len - 1]) {
	case 'k': mul = 1ULL << 10; break;
	case 'm': mul = 1ULL << 20; break;
	case 'g': mul = 1ULL << 30; break;
	case 't': mul = 1ULL << 40; break;
	default: break;
	}
	if (mul != 1)
		num[--len] = '\0';
	if (len == 0 || len > 12)
		return 0;
	for (i = 0; i < len; i++) {
		if (num[i] < '0' || num[i] > '9')
			return 0;
		n = n * 10 + (uint64_t) (num[i] - '0');
	}
	if (n > (1ULL << 30))
		return 0;
	v = n * mul;
	if (v < 4096 || v > (1ULL << 30) || (v & (v - 1)) != 0)
		return 0;
	return 1;
}

static const char *const choosers[] = {
	"random", "roundrobin", "randomized-roundrobin", "balanced", NULL
};
static const char *const meta_choosers[] = {
	"balanced", "random", "roundrobin", NULL
};
static const char *const cache_modes[] = { "native", "paged", NULL };
static const char *const atimes[] = {
	"noatime", "relatime", "strictatime", NULL
};
static const char *const set_services[] = { "mgmtd", "meta", "storage", NULL };
static const char *const names[] = {
	"chunk-size", "stripe", "chooser", "meta-chooser", "meta",
	"cache-mode", "atime", "mirror", "set", NULL
};

/* SERVICE.KEY=VALUE: a known service, a key of [A-Za-z0-9_.-], any value. */
static int valid_set(const char *v, char *err, size_t errlen)
{
	const char *dot = strchr(v, '.'), *eq = strchr(v, '=');
	char svc[16];
	size_t n;
	const char *k;

	if (!dot || !eq || eq < dot) {
		snprintf(err, errlen, "set=%.80s: expected set=SERVICE.KEY=VALUE, "
			 "e.g. set=meta.checkpoint_secs=30", v);
		return 0;
	}
	n = (size_t) (dot - v);
	if (n == 0 || n >= sizeof(svc)) {
		snprintf(err, errlen, "set=%.80s: missing or unknown service", v);
		return 0;
	}
	memcpy(svc, v, n);
	svc[n] = '\0';
	if (!is_one_of(svc, set_services)) {
		char l[128];
		list_of(set_services, l, sizeof(l));
		snprintf(err, errlen, "set=%.80s: unknown service '%.16s' (one of: %s)",
			 v, svc, l);
		return 0;
	}
	if (eq == dot + 1) {
		snprintf(err, errlen, "set=%.80s: missing KEY", v);
		return 0;
	}
	for (k = dot + 1; k < eq; k++) {
		char c = *k;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.')) {
			snprintf(err, errlen, "set=%.80s: KEY may hold only letters, "
				 "digits, '_', '-' and '.'", v);
			return 0;
		}
	}
	return 1;
}

/* One item NAME or NAME=VALUE (unescaped). */
static int valid_item(const char *item, unsigned *seen, char *err, size_t errlen)
{
	char name[32];
	const char *eq = strchr(item, '=');
	const char *val = eq ? eq + 1 : NULL;
	size_t n = eq ? (size_t) (eq - item) : strlen(item);
	unsigned long num;
	int i;
	char l[128];

	if (n == 0) {
		snprintf(err, errlen, "empty option name in '%.80s'", item);
		return 0;
	}
	if (n >= sizeof(name)) {
		snprintf(err, errlen, "unknown option '%.*s'", 40, item);
		return 0;
	}
	memcpy(name, item, n);
	name[n] = '\0';
	for (i = 0; names[i]; i++)
		if (strcmp(name, names[i]) == 0)
			break;
	if (!names[i]) {
		list_of(names, l, sizeof(l));
		snprintf(err, errlen, "unknown option '%.31s' (known: %s)", name, l);
		return 0;
	}
	if (strcmp(name, "set") != 0) {
		if (*seen & (1u << i)) {
			snprintf(err, errlen, "option '%.31s' given twice", name);
			return 0;
		}
		*seen |= 1u << i;
	}
	if (strcmp(name, "mirror") == 0) {
		if (val) {
			snprintf(err, errlen, "option 'mirror' takes no value "
				 "(write just 'mirror')");
			return 0;
		}
		return 1;
	}
	if (!val || !*val) {
		snprintf(err, errlen, "option '%.31s' needs a value (%.31s=...)", name, name);
		return 0;
	}
	if (strcmp(name, "chunk-size") == 0) {
		if (!valid_chunk_size(val)) {
			snprintf(err, errlen, "chunk-size=%.80s: must be a power of two "
				 "from 4k to 1g (e.g. 512k, 1m)", val);
			return 0;
		}
	} else if (strcmp(name, "stripe") == 0) {
		if (parse_uint(val, 0, 65536, &num)) {
			snprintf(err, errlen, "stripe=%.80s: must be a number from 0 "
				 "(all targets) to 65536", val);
			return 0;
		}
	} else if (strcmp(name, "meta") == 0) {
		if (parse_uint(val, 1, 4096, &num)) {
			snprintf(err, errlen, "meta=%.80s: must be a number from 1 "
				 "to 4096", val);
			return 0;
		}
	} else if (strcmp(name, "chooser") == 0 ||
		   strcmp(name, "meta-chooser") == 0 ||
		   strcmp(name, "cache-mode") == 0 ||
		   strcmp(name, "atime") == 0) {
		const char *const *set =
			strcmp(name, "chooser") == 0 ? choosers :
			strcmp(name, "meta-chooser") == 0 ? meta_choosers :
			strcmp(name, "cache-mode") == 0 ? cache_modes : atimes;
		if (!is_one_of(val, set)) {
			list_of(set, l, sizeof(l));
			snprintf(err, errlen, "%s=%.80s: must be one of: %s", name, val, l);
			return 0;
		}
	} else if (strcmp(name, "set") == 0) {
		return valid_set(val, err, errlen);
	}
	return 1;
}

/*
 * Validates a whole OPTS string. "" and "default" mean: no options.
 * Returns 1 when valid, else 0 with a message in err.
 */
static int valid_opts(const char *s, char *err, size_t errlen)
{
	char item[HIVEFS_OPTS_MAX + 1];
	size_t n = 0;
	unsigned seen = 0;
	const char *p;

	if (strlen(s) > HIVEFS_OPTS_MAX) {
		snprintf(err, errlen, "options longer than %d characters",
			 HIVEFS_OPTS_MAX);
		return 0;
	}
	if (*s == '\0' || strcmp(s, HIVEFS_DEFAULT_OPTS) == 0)
		return 1;
	for (p = s;; p++) {
		unsigned char c = (unsigned char) *p;
		if (c == '\\') {
			if (p[1] == ',' || p[1] == '\\') {
				item[n++] = *++p;
				continue;
			}
			snprintf(err, errlen, "a backslash may only escape ',' or "
				 "'\\' (write \\, for a comma inside a value)");
			return 0;
		}
		if (c == ',' || c == '\0') {
			item[n] = '\0';
			if (n == 0) {
				snprintf(err, errlen, "empty item (two commas in a row, "
					 "or a comma at either end)");
				return 0;
			}
			if (!valid_item(item, &seen, err, errlen))
				return 0;
			n = 0;
			if (c == '\0')
				return 1;
			continue;
		}
		if (c < 0x20 || c == 0x7f) {
			snprintf(err, errlen, "control characters are not allowed");
			return 0;
		}
		item[n++] = (char) c;
	}
}

/* ---- callbacks ----------------------------------------------------------- */

static int option_cb(int val, const char *optarg, int remote)
{
	char err[256];
	const char *o = optarg ? optarg : "";

	(void) val;
	/*
	 * Slurm 22.05 forwards a bare --hivefs to the job's environment as the
	 * text "(null)" (SLURM_SPANK__SLURM_SPANK_OPTION_hivefs_hivefs), and an
	 * srun inside the job reads it back from there: it means "no options".
	 */
	if (strcmp(o, "(null)") == 0)
		o = "";
	if (!valid_opts(o, err, sizeof(err))) {
		slurm_error("hivefs: invalid --hivefs=%.80s: %s", o, err);
		return -1;
	}
	if (*o == '\0')
		o = HIVEFS_DEFAULT_OPTS;
	snprintf(opts, sizeof(opts), "%s", o);
	requested = 1;
	if (remote)
		slurm_debug("hivefs: --hivefs=%s in effect", opts);
	return 0;
}

static int parse_plugin_args(int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "mount=", 6) == 0) {
			const char *m = av[i] + 6;
			size_t len = strlen(m);
			if (m[0] != '/' || len < 2 || len > HIVEFS_PATH_MAX - 32) {
				slurm_error("hivefs: plugstack.conf: mount=%.80s: need an "
					    "absolute directory", m);
				return -1;
			}
			snprintf(mount_base, sizeof(mount_base), "%s", m);
			/* no trailing slash: the job sees <base>/job<ID> */
			while (len > 1 && mount_base[len - 1] == '/')
				mount_base[--len] = '\0';
		} else {
			slurm_error("hivefs: plugstack.conf: unknown argument '%s' "
				    "(known: mount=DIR)", av[i]);
			return -1;
		}
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_err_t rc;

	if (parse_plugin_args(ac, av))
		return -1;
	rc = spank_option_register(sp, &hivefs_option);
	if (rc != ESPANK_SUCCESS) {
		slurm_error("hivefs: cannot register --hivefs: %s",
			    spank_strerror(rc));
		return -1;
	}
	return 0;
}

/* Allocator (sbatch, salloc) and local (srun) context: hand OPTS to the prolog. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	spank_err_t rc;

	(void) ac;
	(void) av;
	if (!requested)
		return 0;
	if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL)
		return 0;
	/*
	 * srun inside an existing allocation (it inherits --hivefs from the
	 * batch script's environment) allocates nothing: the prolog already ran.
	 */
	if (ctx == S_CTX_LOCAL && getenv("SLURM_JOB_ID"))
		return 0;
	rc = spank_job_control_setenv(sp, "HIVEFS", opts, 1);
	if (rc != ESPANK_SUCCESS) {
		slurm_error("hivefs: cannot pass --hivefs to the prolog: %s",
			    spank_strerror(rc));
		return -1;
	}
	slurm_verbose("hivefs: job gets a HiveFS file system (%s)", opts);
	return 0;
}

/* Remote context (slurmstepd), as the job's user: the job's environment. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	uint32_t jobid = 0;
	char name[32], path[HIVEFS_PATH_MAX + 64];
	struct stat st;
	spank_err_t rc;

	(void) ac;
	(void) av;
	if (!requested || !spank_remote(sp))
		return 0;
	rc = spank_get_item(sp, S_JOB_ID, &jobid);
	if (rc != ESPANK_SUCCESS) {
		slurm_error("hivefs: cannot get the job id: %s", spank_strerror(rc));
		return -1;
	}
	snprintf(name, sizeof(name), "job%u", (unsigned) jobid);
	snprintf(path, sizeof(path), "%s/%s", mount_base, name);
	if (stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
		slurm_error("hivefs: job %u has no HiveFS file system on this node "
			    "(%s is missing): the job was allocated without --hivefs, "
			    "or its prolog did not start one", (unsigned) jobid, path);
		return -1;
	}
	if (spank_setenv(sp, "HIVEFS_MOUNT", path, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "HIVEFS_NAME", name, 1) != ESPANK_SUCCESS) {
		slurm_error("hivefs: cannot set HIVEFS_MOUNT/HIVEFS_NAME");
		return -1;
	}
	return 0;
}
