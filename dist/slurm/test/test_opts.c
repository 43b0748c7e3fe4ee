/*
 * Unit test of the --hivefs option rules of hivefs_spank.c, without Slurm: the
 * plugin source is included, and the few Slurm functions it calls are stubbed.
 * Built and run by dist/slurm/test/test.sh (or `make -C dist/slurm test`).
 */
#include <stdarg.h>

#include "../hivefs_spank.c"

static char last_error[512];

void slurm_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
}
void slurm_info(const char *fmt, ...) { (void) fmt; }
void slurm_verbose(const char *fmt, ...) { (void) fmt; }
void slurm_debug(const char *fmt, ...) { (void) fmt; }
const char *spank_strerror(spank_err_t err) { (void) err; return "stub"; }
spank_context_t spank_context(void) { return S_CTX_ALLOCATOR; }
int spank_remote(spank_t sp) { (void) sp; return 0; }
spank_err_t spank_option_register(spank_t sp, struct spank_option *o)
{
	(void) sp; (void) o; return ESPANK_SUCCESS;
}
spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	(void) sp; (void) item; return ESPANK_ERROR;
}
spank_err_t spank_setenv(spank_t sp, const char *n, const char *v, int o)
{
	(void) sp; (void) n; (void) v; (void) o; return ESPANK_SUCCESS;
}
static char control_env[2048];
spank_err_t spank_job_control_setenv(spank_t sp, const char *n, const char *v, int o)
{
	(void) sp; (void) o;
	snprintf(control_env, sizeof(control_env), "SPANK_%s=%s", n, v);
	return ESPANK_SUCCESS;
}

static int passed, failed;

static void check(const char *opts, int want_ok, const char *want_in_error)
{
	int ok;

	last_error[0] = '\0';
	requested = 0;
	ok = option_cb(0, opts, 0) == 0;
	if (ok != want_ok || (!ok && want_in_error && !strstr(last_error, want_in_error))) {
		printf("FAIL --hivefs=%s: %s (error: %s)\n", opts ? opts : "<bare>",
		       ok ? "accepted" : "rejected", last_error);
		failed++;
	} else {
		passed++;
	}
}

static void check_env(const char *opts, const char *want)
{
	requested = 0;
	control_env[0] = '\0';
	if (option_cb(0, opts, 0) != 0 || slurm_spank_init_post_opt(NULL, 0, NULL) != 0 ||
	    strcmp(control_env, want) != 0) {
		printf("FAIL --hivefs=%s: control env '%s', want '%s'\n",
		       opts ? opts : "<bare>", control_env, want);
		failed++;
	} else {
		passed++;
	}
}

int main(void)
{
	char *args_ok[] = { "mount=/scratch/hivefs/" };
	char *args_bad[] = { "mnt=/x" };
	char *args_rel[] = { "mount=rel" };

	/* valid */
	check(NULL, 1, NULL);
	check("", 1, NULL);
	check("(null)", 1, NULL); /* Slurm 22.05's text for a bare option */
	check("default", 1, NULL);
	check("chunk-size=1m,stripe=4,chooser=balanced,meta=2,cache-mode=paged,mirror", 1, NULL);
	check("chunk-size=4k", 1, NULL);
	check("chunk-size=1g", 1, NULL);
	check("chunk-size=4096", 1, NULL);
	check("chunk-size=512KiB", 1, NULL);
	check("chunk-size=2MB", 1, NULL);
	check("stripe=0", 1, NULL);
	check("stripe=65536", 1, NULL);
	check("meta-chooser=roundrobin,atime=relatime,chooser=randomized-roundrobin", 1, NULL);
	check("set=meta.checkpoint_secs=30,set=storage.x_y=1", 1, NULL);
	check("set=mgmtd.list=a\\,b\\,c", 1, NULL);
	check("set=meta.path=C:\\\\dir", 1, NULL);
	check("set=meta.empty=", 1, NULL);
	/* invalid */
	check("chunk-size=3m", 0, "power of two");
	check("chunk-size=2k", 0, "power of two");
	check("chunk-size=2g", 0, "power of two");
	check("chunk-size=99999999999999t", 0, "power of two");
	check("chunk-size=", 0, "needs a value");
	check("chunk-size", 0, "needs a value");
	check("stripe=65537", 0, "stripe");
	check("stripe=-1", 0, "stripe");
	check("stripe=1x", 0, "stripe");
	check("meta=0", 0, "meta");
	check("chooser=fast", 0, "one of");
	check("meta-chooser=randomized-roundrobin", 0, "one of");
	check("cache-mode=direct", 0, "one of");
	check("atime=always", 0, "one of");
	check("mirror=yes", 0, "no value");
	check("stripe=2,stripe=4", 0, "twice");
	check("bogus", 0, "unknown option 'bogus'");
	check("Stripe=2", 0, "unknown option");
	check("stripe=2,", 0, "empty item");
	check(",stripe=2", 0, "empty item");
	check("stripe=2,,mirror", 0, "empty item");
	check("set=meta", 0, "SERVICE.KEY=VALUE");
	check("set=fuse.x=1", 0, "unknown service");
	check("set=meta.=1", 0, "missing KEY");
	check("set=meta.a b=1", 0, "KEY may hold");
	check("set=meta.a=1\\n", 0, "backslash");
	check("set=meta.a=\x01", 0, "control");
	check("=1", 0, "empty option name");

	/* what the prolog gets */
	check_env(NULL, "SPANK_HIVEFS=default");
	check_env("chunk-size=1m,stripe=2", "SPANK_HIVEFS=chunk-size=1m,stripe=2");
	check_env("set=meta.l=a\\,b", "SPANK_HIVEFS=set=meta.l=a\\,b");

	/* plugstack.conf arguments */
	if (parse_plugin_args(1, args_ok) != 0 || strcmp(mount_base, "/scratch/hivefs") != 0) {
		printf("FAIL mount=/scratch/hivefs/: got %s\n", mount_base);
		failed++;
	} else {
		passed++;
	}
	if (parse_plugin_args(1, args_bad) == 0 || parse_plugin_args(1, args_rel) == 0) {
		printf("FAIL bad plugin arguments accepted\n");
		failed++;
	} else {
		passed++;
	}

	printf("spank options: %d passed, %d failed\n", passed, failed);
	return failed != 0;
}
